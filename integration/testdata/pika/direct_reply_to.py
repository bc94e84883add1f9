"""Direct reply-to with python3-pika: python3 direct_reply_to.py URL QUEUE.

The RPC client consumes amq.rabbitmq.reply-to (auto-ack) and publishes one request with
reply_to=amq.rabbitmq.reply-to to QUEUE, then prints {"published": true} and waits for a
line on stdin (the test checks the copies meanwhile). The server, on a second connection,
gets the request with basic_get, replies to the reply_to it sees through the default
exchange and acks; the client waits for the reply. The last line printed is JSON: what the
server saw and what the client got.
"""
import json
import sys

import pika

url, queue = sys.argv[1], sys.argv[2]
params = pika.URLParameters(url)

client = pika.BlockingConnection(params)
client_channel = client.channel()
replies = []
client_channel.basic_consume(
    queue="amq.rabbitmq.reply-to",
    on_message_callback=lambda ch, method, props, body: replies.append(
        {"correlation_id": props.correlation_id, "body": body.decode()}),
    auto_ack=True)
client_channel.basic_publish(
    exchange="", routing_key=queue, body=b"2+2",
    properties=pika.BasicProperties(reply_to="amq.rabbitmq.reply-to", correlation_id="pika-1"))
client.process_data_events(time_limit=0)
print(json.dumps({"published": True}), flush=True)
sys.stdin.readline()

server = pika.BlockingConnection(params)
server_channel = server.channel()
method, props, body = None, None, None
for _ in range(300):
    method, props, body = server_channel.basic_get(queue=queue, auto_ack=False)
    if method is not None:
        break
    server.sleep(0.1)
seen = {"request": None if method is None else {"reply_to": props.reply_to, "body": body.decode()}}
if method is not None:
    server_channel.basic_publish(
        exchange="", routing_key=props.reply_to, body=b"4",
        properties=pika.BasicProperties(correlation_id=props.correlation_id))
    server_channel.basic_ack(method.delivery_tag)

for _ in range(300):
    if replies:
        break
    client.process_data_events(time_limit=0.1)
seen["replies"] = replies
print(json.dumps(seen), flush=True)
server.close()
client.close()
