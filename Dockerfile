# syntax=docker/dockerfile:1
#
# amqp-mirror in a small image: a static binary on distroless, run as a
# non-root user. Build and run (docker-compose.yml does both for the
# three-node sidecar deployment):
#
#   docker build -t amqp-mirror .
#   docker run -v ./amqp-mirror.yaml:/etc/amqp-mirror/amqp-mirror.yaml:ro \
#              -v amqp-mirror-state:/var/lib/amqp-mirror -p 5672:5672 amqp-mirror
#
# The image holds no config: mount one at /etc/amqp-mirror/amqp-mirror.yaml
# with state_dir: /var/lib/amqp-mirror (the one directory the user may
# write; keep it on a volume, the metadata log in state_dir/raft must
# survive a restart). integration/compose_test.go keeps this file in step
# with go.mod and docker-compose.yml.

# The go directive of go.mod, major.minor.
ARG GO_VERSION=1.26

FROM golang:${GO_VERSION} AS build
WORKDIR /src
# Modules first, in a layer of their own, so that a source change does not
# download them again.
COPY go.mod go.sum ./
RUN go mod download
COPY . .
# Static (no cgo: distroless/static has no libc), without the build
# machine's paths (-trimpath) and without symbols (-s -w): about a third
# smaller, and panics still print file:line.
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o /out/amqp-mirror . \
    && mkdir -p /out/state

# distroless/static: CA certificates (amqps:// backends), /etc/passwd with
# the nonroot user (65532), no shell and no package manager.
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/amqp-mirror /usr/local/bin/amqp-mirror
# state_dir, owned by the user, so that a named volume mounted here starts
# out writable (Docker copies the image's directory and owner into it).
COPY --from=build --chown=65532:65532 /out/state /var/lib/amqp-mirror
USER 65532:65532
# 5672 AMQP, 5671 AMQPS (when listen.tls is set), 15680 admin API and
# /metrics; between sidecar proxies 7946 serf gossip (TCP and UDP) and 7947
# the metadata log's raft (cluster.bind's port + 1).
EXPOSE 5672 5671 15680 7946 7946/udp 7947
# Healthy while the proxy can serve clients (/readyz: not paused, metadata
# caught up, its home backend up), asked by ctl at listen.admin of the
# mounted config; no shell or curl is needed, nor the admin token.
HEALTHCHECK --interval=10s --timeout=5s --start-period=45s --retries=3 \
    CMD ["amqp-mirror", "ctl", "--config", "/etc/amqp-mirror/amqp-mirror.yaml", "--timeout", "3s", "-q", "check_ready"]
ENTRYPOINT ["amqp-mirror"]
CMD ["serve", "--config", "/etc/amqp-mirror/amqp-mirror.yaml"]
