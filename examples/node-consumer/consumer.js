// A consumer of outbox-relay's messages in Node.js with amqplib: it prints
// every AMQP property and header the relay sets, as docs/wire.md describes
// them, and acknowledges each message after printing it.
//
//   npm install
//   AMQP_URL=amqp://guest:guest@127.0.0.1:5672/ EXCHANGE=outbox-demo QUEUE=node-consumer node consumer.js
//
// Environment: AMQP_URL; QUEUE (declared durable if missing); EXCHANGE and
// BINDING_KEY (optional: bind QUEUE to that topic exchange, default key '#');
// COUNT (stop after that many messages; 0, the default, runs until Ctrl-C).
'use strict';

const amqp = require('amqplib');

const url = process.env.AMQP_URL || 'amqp://guest:guest@127.0.0.1:5672/';
const queue = process.env.QUEUE || 'node-consumer';
const exchange = process.env.EXCHANGE || '';
const bindingKey = process.env.BINDING_KEY || '#';
const count = Number(process.env.COUNT || 0);

// x-created-at is "2026-11-23T13:45:01.123456Z": RFC 3339, UTC, exactly six
// fractional digits. Date.parse keeps milliseconds only, so the microseconds
// are read from the text.
function createdAtMicros(text) {
  const m = /^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)\.(\d{6})Z$/.exec(text);
  if (!m) throw new Error(`x-created-at ${JSON.stringify(text)} is not RFC 3339 UTC with microseconds`);
  return BigInt(Date.parse(`${m[1]}Z`)) * 1000n + BigInt(m[2]);
}

// describe names the JavaScript value amqplib decoded a header into. amqplib
// gives both AMQP int64 ('l') and double ('d') as a Number; the relay sends
// an integer as int64 only when it is one within int64's range, so
// Number.isInteger tells them apart except for a double like 1e21. An int64
// beyond ±2^53 loses digits in a Number: read such headers with care.
function describe(v) {
  if (v === null) return 'null (AMQP void: JSON null)';
  if (Array.isArray(v)) return `array [${v.map(describe).join(', ')}]`;
  if (Buffer.isBuffer(v)) return `bytes ${v.toString('hex')}`;
  if (typeof v === 'object') {
    return `table {${Object.entries(v).map(([k, e]) => `${k}: ${describe(e)}`).join(', ')}}`;
  }
  if (typeof v === 'number') {
    const note = Number.isSafeInteger(v) || !Number.isInteger(v) ? '' : ' (beyond 2^53: digits may be lost)';
    return `number ${v}${note}`;
  }
  // A number no int64 or double holds exactly (18446744073709551615, 1e400,
  // 0.1000000000000000000001) arrives as a string of its JSON text.
  return `${typeof v} ${JSON.stringify(v)}`;
}

// showBody prints the body as text when it is UTF-8, else as hex: the relay
// passes the payload through byte for byte, whatever content-type says.
function showBody(body) {
  let text;
  try {
    text = JSON.stringify(new TextDecoder('utf-8', { fatal: true }).decode(body));
  } catch {
    text = `hex ${body.toString('hex')}`;
  }
  return `(${body.length} bytes) ${text.length > 200 ? `${text.slice(0, 200)}...` : text}`;
}

async function main() {
  const conn = await amqp.connect(url);
  const ch = await conn.createChannel();
  await ch.assertQueue(queue, { durable: true });
  if (exchange) {
    await ch.assertExchange(exchange, 'topic', { durable: true });
    await ch.bindQueue(queue, exchange, bindingKey);
  }
  await ch.prefetch(100);

  // Delivery is at least once: a message may come again (same messageId)
  // after a relay restart or a lost connection. A real consumer records the
  // messageId in the same database transaction as its own writes; this one
  // only remembers it for the process's lifetime.
  const seen = new Set();
  let received = 0;
  let resolveDone;
  const done = new Promise((resolve) => { resolveDone = resolve; });

  await ch.consume(queue, (msg) => {
    if (msg === null) { // the broker cancelled the consumer (queue deleted)
      resolveDone();
      return;
    }
    // Past COUNT: leave the message unacknowledged; closing the channel
    // gives it back to the queue.
    if (count > 0 && received >= count) return;
    const { fields, properties: p } = msg;
    const h = p.headers || {};
    const lines = [
      `message ${p.messageId}${seen.has(p.messageId) ? ' (duplicate: already processed)' : ''}`,
      `  exchange / routing key  ${JSON.stringify(fields.exchange)} / ${JSON.stringify(fields.routingKey)}  redelivered=${fields.redelivered}`,
      `  type                    ${p.type === undefined ? '(unset: message_type was \'\')' : JSON.stringify(p.type)}`,
      `  content type            ${p.contentType}`,
      `  delivery mode           ${p.deliveryMode} (2 = persistent)`,
      `  timestamp               ${p.timestamp} s = ${new Date(p.timestamp * 1000).toISOString()} (created_at, whole seconds)`,
      `  x-created-at            ${h['x-created-at']} (created_at, microseconds, UTC)`,
      `  x-outbox-id             ${h['x-outbox-id']}`,
      `  x-partition-key         ${JSON.stringify(h['x-partition-key'])}`,
      `  x-relay-epoch           ${h['x-relay-epoch']}`,
      `  x-replay                ${h['x-replay'] === true ? 'true (republished by outbox-relay replay)' : '(absent: a live delivery)'}`,
    ];
    if (h['x-created-at'] !== undefined) {
      const latencyMicros = BigInt(Date.now()) * 1000n - createdAtMicros(h['x-created-at']);
      lines.push(`  latency                 ${Number(latencyMicros) / 1000} ms from created_at to now`);
    }
    for (const [k, v] of Object.entries(h)) {
      if (!k.startsWith('x-')) lines.push(`  header ${k.padEnd(16)} ${describe(v)}`);
    }
    lines.push(`  body                    ${showBody(msg.content)}`);
    console.log(lines.join('\n'));

    seen.add(p.messageId);
    ch.ack(msg);
    received++;
    if (count > 0 && received >= count) resolveDone();
  }, { noAck: false });

  process.once('SIGINT', resolveDone);
  process.once('SIGTERM', resolveDone);
  await done;
  await ch.close(); // after the acks sent so far
  await conn.close();
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
