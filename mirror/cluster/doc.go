// Package cluster is the membership of the sidecar cluster: one proxy
// beside each broker (a node), the proxies joined with serf, and the queue
// metadata log (store.Store) with a raft voter on every node.
//
// # What serf gives
//
// Membership and failure detection (hashicorp/serf over memberlist's SWIM
// gossip): every proxy knows every other proxy's name, its tags (client
// AMQP address, admin address, backend, raft address) and whether it is
// alive, leaving, left (a graceful Leave) or failed (it stopped answering:
// a crash, a kill, a partition). Serf gives no agreement: two proxies may
// see different members for a while, and both sides of a partition see the
// other side as failed. So serf decides nothing about queues; it only tells
// the log who its voters should be, and tells the proxy where its peers
// are.
//
// # What raft gives
//
// The metadata (master, slaves in join order, synchronised set, epoch) is
// a hashicorp/raft log with a voter on every node, carried over TCP on a
// port of its own (Config.RaftBind, advertised in the serf tag "raft").
// A write commits only when a majority of the voters stored it, there is
// at most one leader per term, and every node applies the same writes in
// the same order; writes are conditional on the version the writer read
// (store.Store), so a decision taken on a stale read fails with
// store.ErrConflict instead of overwriting a newer one. Reads are local
// and may lag the leader. A node that rejoins, after a crash or a
// partition, receives what it missed from the leader (log entries or a
// snapshot), never from gossip; after a restart its Store().WaitLeader
// returns only once it has applied the log as far as the leader had when
// asked (catchup.go), so its proxy does not serve from the metadata it had
// before.
//
// # Voters follow membership
//
// As in Consul and Nomad, the raft leader adds a voter for every alive
// member and removes the voter of a member that left gracefully or that
// serf reaped (failed for longer than Config.ReconnectTimeout, 72h by
// default). A failed member keeps its vote: the quorum never shrinks
// because nodes stopped answering, so two sides of a partition can never
// both hold a majority. A graceful Leave does shrink it (a three-node
// cluster that lost one node by Leave is a two-node cluster, which
// tolerates no further failure; one that lost a node by failure still
// counts three voters and needs two of them).
//
// The cluster is formed once, the bootstrap_expect way (as in Consul):
// every node of a new cluster is started with Config.BootstrapExpect set
// to the cluster's size; when that many alive members with the same value
// see each other, the one with the lowest name bootstraps the log with all
// of them as voters, and the others, which have no configuration and so
// never start an election, follow the leader it becomes. Nodes added to a
// running cluster start with 0 and are added by the leader. A node with
// existing raft state never bootstraps, nor does one that sees a member
// already in a log (each node says so in its serf tag "in_log"), so a
// node started later with the cluster's BootstrapExpect joins too. This
// cannot elect two leaders
// unless two groups of BootstrapExpect fresh nodes are started that do not
// gossip with each other, which a correct BootstrapExpect rules out.
//
// # Failure detection
//
// Defaults, tuned for a LAN (memberlist's DefaultLANConfig with faster
// probes): ProbeInterval 200ms, ProbeTimeout 100ms, SuspicionMult 2,
// GossipInterval 100ms. A dead node is probed within two probe intervals
// in a three-node cluster, its probe fails (direct, indirect, then a TCP
// fallback) within one interval, and it is declared failed after the
// suspicion timeout of SuspicionMult × ProbeInterval × max(1, log10(n)) =
// 400ms for up to ten nodes: about one second in the worst case. Measured
// on loopback (TestFailedNodeKeepsItsVoteAndCatchesUp, a killed node as
// seen by both survivors): 0.63-0.87s over six runs, 0.77-0.82s with -race.
// The price of fast detection is false suspicion on an overloaded host (a
// node that stalls for a second is declared failed, refutes it, and comes
// back); a failure event therefore only starts a decision, which the log
// then records or refuses.
//
// Raft runs with ElectionTimeout 500ms: after a leader dies a follower
// starts an election after 0.5-1s without heartbeats, so a new leader is
// usually there within 1.5s (measured 0.7-1.4s after the kill).
//
// # Majority (pause_minority)
//
// Cluster.Majority tells whether this node can commit to the log: it
// leads, or it follows a leader whose heartbeats arrive. On the minority
// side of a partition it turns false within about two ElectionTimeouts
// (a cut-off leader steps down after ElectionTimeout/2 without a quorum,
// measured 0.31s; a cut-off follower forgets its leader after one to two
// randomised heartbeat timeouts, measured 1.1-1.6s), and
// every write there fails with store.ErrNotLeader. The proxy stops
// serving mirrored queues while it is false, as RabbitMQ's pause_minority
// does, and serves again when it turns true (Store().LeaderChanges tells
// when to look). The majority side goes on: it elects a leader if the old
// one was cut off, and the cut-off node keeps its vote. When the partition
// heals, raft brings the minority up to date at once (measured 0.03-1.2s)
// and serf merges the two views within its reconnect interval of 2s
// (measured 0.3-2.1s).
//
// # What a proxy runs on the cluster
//
// PauseInMinority (pause.go) pauses a proxy that sees no more than half of
// the members alive, counting a member serf holds failed as alive while
// its raft port still answers. WatchMembers (verdicts.go) hands serf's
// verdicts on the other proxies to the engine, once a failure has lasted
// memberFailedFor. PolicyLog (policylog.go) keeps the runtime policies in
// the metadata log, for a proxy alone (its single-voter store.Store) as
// for a cluster.
//
// # Writes from any node
//
// A write (Cluster.Put, Cluster.Delete, and runtime policy changes:
// Cluster.ChangePolicies) commits on the leader. On the
// leader it is applied locally; on a follower it is forwarded to the
// leader over the leader's raft port (a connection whose first byte marks
// it as a forwarded write rather than raft traffic; see forward.go), so a
// client may connect to any proxy and use any queue. A forwarded write is
// still conditional: when its answer is lost (the connection or the
// leader fails mid-way) the write may or may not have committed, and the
// caller must read again and decide again, never resend blindly.
//
// # Messages between proxies
//
// Some work needs no consensus but must reach one particular proxy: the
// settles of a slave copy go to the proxy beside it, which alone trims it
// (SendSettles), or a message of another kind (Send, Handle). Peers
// (Cluster.Peers) owns this messaging: its senders, the members'
// addresses, which the Cluster refreshes after each membership event,
// and the handlers; the Cluster hands it the connections its raft port
// classifies as peer messages or calls. They
// travel on the raft port too, on one long-lived connection per
// destination marked by its first byte, as batches of JSON; delivery is
// best effort (a full queue, an unknown or dead destination, or a failed
// write drops them) and never blocks the sender, which is on the client's
// ack path. Work whose caller must know it is done before it answers its
// client, such as purging the slave copy another proxy trims
// (PurgeSlave), is a call instead: a connection of its own that waits for
// the answer, as forwarded writes do. Work that outlasts a call, the copy
// of a synchronised slave into a new one for its sync (StartCopy), runs as
// a job on the callee, which the caller names and asks after (CopyState).
// Questions for every other proxy at once (Unacked, Unrecorded, CountDown,
// Delivered: which messages of a queue each delivered before a promotion)
// are calls to each, in parallel, bounded by the caller's context.
//
// # Not guaranteed
//
//   - Majority is this node's view: a leader cut off from the others still
//     believes it leads for up to ElectionTimeout/2, and a follower
//     believes in its leader until its heartbeat timeout. Writes are safe
//     (they need a quorum), but anything done on the strength of Majority
//     alone in that window is not; queue epochs fence a stale master.
//   - Losing a majority of the voters permanently (two of three nodes
//     destroyed) stops all writes; recovering needs an operator (raft's
//     peers.json procedure), not built here.
//   - A node whose data dir is lost must not come back under the same name
//     while it is still a voter: it would vote with an empty log. Remove
//     it (Leave, or wait for the reap), then start it afresh.
//   - Gossip is encrypted and authenticated when Config.GossipKey is set or
//     the data dir holds a keyring (keyring.go): a proxy without one of
//     the keys can neither join nor be gossiped about, and Keyring rotates
//     the keys on every live member.
//   - The raft port (raft, forwarded writes, peer messages and calls) runs
//     mutual TLS when Config.RaftTLS is set: each side presents a member's
//     certificate and accepts only one of the cluster's authority that
//     names the members' identity (pki.Mutual), so another certificate of
//     that authority is refused too. Without RaftTLS it is plaintext and
//     unauthenticated: bind it to a trusted network.
package cluster
