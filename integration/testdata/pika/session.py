"""One pika session whose observations the Go test compares, directly and through the proxy.

Usage: session.py URL PREFIX

Runs, with pika's BlockingConnection against URL: an exchange, a queue and a binding named
after PREFIX; publishes with publisher confirms (routable, unroutable); a consumer with
manual acks; basic_get; a transaction committed and one rolled back; a channel error; a
login with a wrong password. Prints one JSON object of what pika observed, free of anything
that changes between runs (names, consumer tags, ports), and exits 0 even when the broker
refused something: refusals are observations too.
"""
import hashlib
import json
import sys
import time

import pika


def properties_of(props):
    return {
        "content_type": props.content_type,
        "content_encoding": props.content_encoding,
        "headers": props.headers,
        "delivery_mode": props.delivery_mode,
        "priority": props.priority,
        "correlation_id": props.correlation_id,
        "reply_to": props.reply_to,
        "expiration": props.expiration,
        "message_id": props.message_id,
        "timestamp": props.timestamp,
        "type": props.type,
        "user_id": props.user_id,
        "app_id": props.app_id,
        "cluster_id": props.cluster_id,
    }


def failure(error):
    return {"exception": type(error).__name__, "args": [repr(a) for a in error.args]}


def main():
    url, prefix = sys.argv[1], sys.argv[2]
    exchange, queue = prefix + "-exchange", prefix + "-queue"
    seen = {}

    connection = pika.BlockingConnection(pika.URLParameters(url))
    impl = connection._impl  # the server's connection.start as pika kept it
    seen["server_properties"] = impl.server_properties
    seen["tune"] = {
        "channel_max": impl.params.channel_max,
        "frame_max": impl.params.frame_max,
        "heartbeat": impl.params.heartbeat,
    }
    channel = connection.channel()
    channel.exchange_declare(exchange, exchange_type="direct", auto_delete=True)
    declared = channel.queue_declare(queue, exclusive=True)
    seen["queue_declare_ok_messages"] = declared.method.message_count
    channel.queue_bind(queue, exchange, routing_key="key")

    # With confirms on, basic_publish returns once the broker acked, and raises when it
    # returned or nacked the message.
    channel.confirm_delivery()
    decorated = pika.BasicProperties(
        content_type="text/plain", content_encoding="identity",
        headers={"client": "pika", "nested": {"list": [1, "two", {"three": 3}], "flag": True}},
        delivery_mode=2, priority=4, correlation_id="correlation", reply_to="nowhere",
        expiration="600000", message_id="id", timestamp=1700000000, type="type",
        user_id="guest", app_id="pika-session", cluster_id="cluster",
    )
    bodies = [b"first", b"", bytes(range(256)) * 1200]
    published = []
    for i, body in enumerate(bodies):
        try:
            channel.basic_publish(exchange, "key", body, properties=decorated if i == 0 else None, mandatory=True)
            published.append("confirmed")
        except Exception as error:  # noqa: BLE001 - what pika raises is the observation
            published.append(failure(error))
    try:
        channel.basic_publish(exchange, "unbound-key", b"lost", mandatory=True)
        published.append("confirmed")
    except pika.exceptions.UnroutableError as error:
        returned = error.messages[0]
        published.append({
            "exception": "UnroutableError",
            "reply_code": returned.method.reply_code,
            "reply_text": returned.method.reply_text,
            "body": returned.body.decode(),
        })
    seen["publishes"] = published

    deliveries = []

    def on_message(ch, method, props, body):
        deliveries.append({
            "delivery_tag": method.delivery_tag,
            "redelivered": method.redelivered,
            "exchange_is_ours": method.exchange == exchange,
            "routing_key": method.routing_key,
            "size": len(body),
            "sha256": hashlib.sha256(body).hexdigest(),
            "properties": properties_of(props),
        })
        ch.basic_ack(method.delivery_tag)

    channel.basic_qos(prefetch_count=2)
    consumer = channel.basic_consume(queue, on_message, auto_ack=False)
    deadline = time.monotonic() + 10
    while len(deliveries) < len(bodies) and time.monotonic() < deadline:
        connection.process_data_events(time_limit=0.1)
    channel.basic_cancel(consumer)
    seen["deliveries"] = deliveries

    transactional = connection.channel()
    transactional.tx_select()
    for body in (b"tx 1", b"tx 2"):
        transactional.basic_publish(exchange, "key", body)
    transactional.tx_commit()
    transactional.basic_publish(exchange, "key", b"rolled back")
    transactional.tx_rollback()
    seen["after_transactions"] = transactional.queue_declare(queue, passive=True).method.message_count

    gets = []
    for auto_ack in (False, True, False):
        method, props, body = channel.basic_get(queue, auto_ack=auto_ack)
        if method is None:
            gets.append("get-empty")
            continue
        gets.append({
            "delivery_tag": method.delivery_tag,
            "redelivered": method.redelivered,
            "message_count": method.message_count,
            "body": body.decode(),
        })
        if not auto_ack:
            channel.basic_ack(method.delivery_tag)
    seen["gets"] = gets

    doomed = connection.channel()
    try:
        doomed.queue_declare("amqp-mirror-missing-queue", passive=True)
        seen["passive_declare_of_missing_queue"] = "declared"
    except pika.exceptions.ChannelClosedByBroker as error:
        seen["passive_declare_of_missing_queue"] = {
            "exception": type(error).__name__,
            "reply_code": error.reply_code,
            "reply_text": error.reply_text,
        }
    seen["connection_open_after_channel_error"] = connection.is_open
    connection.close()

    refused = pika.URLParameters(url)
    refused.credentials = pika.PlainCredentials("guest", "wrong password")
    refused.connection_attempts = 1
    try:
        pika.BlockingConnection(refused).close()
        seen["wrong_password"] = "connected"
    except pika.exceptions.AMQPConnectionError as error:
        seen["wrong_password"] = failure(error)

    json.dump(seen, sys.stdout, indent=1, sort_keys=True, default=repr)
    print()


if __name__ == "__main__":
    main()
