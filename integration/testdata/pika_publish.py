"""Publish messages with python3-pika, the second client of the integration tests.

Usage: pika_publish.py URL QUEUE COUNT

Declares QUEUE (durable), enables publisher confirms and publishes COUNT persistent
messages with body "pika <i>", message_id "<i>", content_type text/plain and a header
"client: pika"; exits non-zero if any publish is not confirmed.
"""
import sys

import pika


def main():
    url, queue, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        channel = connection.channel()
        channel.queue_declare(queue=queue, durable=True)
        channel.confirm_delivery()
        for i in range(count):
            # With confirms on, basic_publish raises if the broker nacks or returns.
            channel.basic_publish(
                exchange="",
                routing_key=queue,
                body=("pika %d" % i).encode(),
                properties=pika.BasicProperties(
                    content_type="text/plain",
                    delivery_mode=2,
                    message_id=str(i),
                    headers={"client": "pika"},
                ),
                mandatory=True,
            )
    finally:
        connection.close()


if __name__ == "__main__":
    main()
