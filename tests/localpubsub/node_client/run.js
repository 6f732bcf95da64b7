// The official Node.js Pub/Sub client against a running ChatLens emulator (PUBSUB_EMULATOR_HOST).
// Run by tests/localpubsub/test_node_client.py; each check prints "ok" or "not ok" with the reason,
// and the exit status is 1 if any failed. Plain node: no test framework to install.
'use strict';

const assert = require('node:assert/strict');
const {PubSub, v1} = require('@google-cloud/pubsub');

const PROJECT = 'chatlens-node';
const INVALID_ARGUMENT = 3;
const NOT_FOUND = 5;
const ALREADY_EXISTS = 6;

if (!process.env.PUBSUB_EMULATOR_HOST) {
  console.error('PUBSUB_EMULATOR_HOST is not set');
  process.exit(2);
}
const pubsub = new PubSub({projectId: PROJECT});
// The generated clients send one raw request (e.g. 1,001 messages, past the library's batching).
const publisherApi = new v1.PublisherClient(pubsub.options);
const subscriberApi = new v1.SubscriberClient(pubsub.options);

let counter = 0;
const unique = prefix => `${prefix}-${process.pid}-${++counter}`;
const sleep = ms => new Promise(resolve => setTimeout(resolve, ms));

async function waitFor(condition, ms = 10000, what = 'condition') {
  const deadline = Date.now() + ms;
  while (!condition()) {
    if (Date.now() > deadline) throw new Error(`timed out after ${ms} ms waiting for ${what}`);
    await sleep(10);
  }
}

async function rejects(promise, code, what) {
  try {
    await promise;
  } catch (error) {
    assert.equal(error.code, code, `${what}: expected gRPC code ${code}, got ${error.code} (${error.message})`);
    return error;
  }
  throw new Error(`${what} was accepted`);
}

async function topicAndSubscription(subscriptionOptions = {}, topicOptions = {}) {
  const [created] = await pubsub.createTopic(unique('topic'));
  const topic = pubsub.topic(created.name, topicOptions);
  const [subscription] = await topic.createSubscription(unique('sub'), subscriptionOptions);
  return {topic, subscription};
}

// Subscribe with `handler(message, received)`; resolves once `done(received)` holds, then closes.
async function receive(subscription, handler, done, ms = 15000) {
  const received = [];
  const errors = [];
  subscription.on('message', message => {
    received.push(message);
    handler(message, received);
  });
  subscription.on('error', error => errors.push(error));
  try {
    await waitFor(() => errors.length || done(received), ms, 'messages');
    if (errors.length) throw errors[0];
  } finally {
    subscription.removeAllListeners('message');
    await subscription.close();
  }
  return received;
}

const checks = [];
const check = (name, body) => checks.push({name, body});

check('admin: topics and subscriptions are created, read, listed, updated and deleted', async () => {
  const [topic] = await pubsub.createTopic(unique('topic'));
  assert.ok(topic.name.startsWith(`projects/${PROJECT}/topics/`));
  await rejects(pubsub.createTopic(topic.name), ALREADY_EXISTS, 'a second topic of the same name');
  const [metadata] = await topic.getMetadata();
  assert.equal(metadata.name, topic.name);
  const [labelled] = await topic.setMetadata({labels: {team: 'chat'}});
  assert.deepEqual(labelled.labels, {team: 'chat'});
  assert.deepEqual((await topic.exists())[0], true);
  const [topics] = await pubsub.getTopics({pageSize: 1}); // one topic a page: the client follows the tokens
  assert.ok(topics.some(t => t.name === topic.name), 'getTopics lists the topic');
  assert.equal(new Set(topics.map(t => t.name)).size, topics.length, 'no topic listed twice');

  const [subscription] = await topic.createSubscription(unique('sub'), {ackDeadlineSeconds: 20, labels: {a: 'b'}});
  const [read] = await subscription.getMetadata();
  assert.equal(read.topic, topic.name);
  assert.equal(read.ackDeadlineSeconds, 20);
  assert.deepEqual(read.labels, {a: 'b'});
  const [all] = await pubsub.getSubscriptions();
  assert.ok(all.some(s => s.name === subscription.name), 'getSubscriptions lists the subscription');
  const [ofTopic] = await topic.getSubscriptions();
  assert.deepEqual(ofTopic.map(s => s.name), [subscription.name]);
  const [updated] = await subscription.setMetadata({ackDeadlineSeconds: 30, labels: {c: 'd'}});
  assert.equal(updated.ackDeadlineSeconds, 30);
  assert.deepEqual(updated.labels, {c: 'd'});
  await rejects(subscription.setMetadata({enableMessageOrdering: true}), INVALID_ARGUMENT, 'changing message ordering');
  await rejects(topic.createSubscription(unique('sub'), {ackDeadlineSeconds: 5}), INVALID_ARGUMENT, 'a 5 s ack deadline');

  await subscription.delete();
  assert.deepEqual((await subscription.exists())[0], false);
  await rejects(subscription.getMetadata(), NOT_FOUND, 'a deleted subscription');
  await topic.delete();
  assert.deepEqual((await topic.exists())[0], false);
  await rejects(pubsub.topic(topic.name).publishMessage({data: Buffer.from('x')}), NOT_FOUND, 'publishing to a deleted topic');
});

check('publish in batches with attributes; streaming pull receives each message once', async () => {
  const {topic, subscription} = await topicAndSubscription({}, {batching: {maxMessages: 50, maxMilliseconds: 20}});
  const count = 300;
  const ids = await Promise.all(
    Array.from({length: count}, (_, n) =>
      topic.publishMessage({data: Buffer.from(`message ${n}`), attributes: {seq: String(n), kind: 'test'}})
    )
  );
  assert.equal(new Set(ids).size, count);
  const received = await receive(subscription, m => m.ack(), r => r.length >= count);
  await sleep(200); // nothing more arrives: each message came once
  assert.equal(received.length, count);
  assert.deepEqual(new Set(received.map(m => m.id)), new Set(ids));
  for (const m of received) {
    assert.equal(m.data.toString(), `message ${m.attributes.seq}`);
    assert.equal(m.attributes.kind, 'test');
    assert.ok(m.publishTime.getTime() > 0);
  }
});

check('flow control: the stream never holds more unacked messages than the subscriber allows', async () => {
  const {topic, subscription: created} = await topicAndSubscription();
  const subscription = pubsub.subscription(created.name, {flowControl: {maxMessages: 20, allowExcessMessages: false}});
  const count = 200;
  await Promise.all(Array.from({length: count}, (_, n) => topic.publishMessage({data: Buffer.from(String(n))})));
  let inFlight = 0;
  let most = 0;
  const received = await receive(
    subscription,
    m => {
      most = Math.max(most, ++inFlight);
      setTimeout(() => { inFlight--; m.ack(); }, 2);
    },
    r => r.length >= count
  );
  assert.equal(new Set(received.map(m => m.id)).size, count);
  assert.ok(most <= 20, `${most} messages in flight at once`);
});

check('nack redelivers, with the delivery attempt counted', async () => {
  const {topic: deadLetters} = await topicAndSubscription();
  const {topic, subscription} = await topicAndSubscription({
    deadLetterPolicy: {deadLetterTopic: deadLetters.name, maxDeliveryAttempts: 10},
  });
  const id = await topic.publishMessage({data: Buffer.from('retry me')});
  const received = await receive(
    subscription,
    m => (m.deliveryAttempt < 3 ? m.nack() : m.ack()),
    r => r.length >= 3
  );
  assert.deepEqual(received.map(m => [m.id, m.deliveryAttempt]), [[id, 1], [id, 2], [id, 3]]);
  assert.equal(new Set(received.map(m => m.ackId)).size, 3, 'each delivery has its own ack id');
});

check('ack deadlines: modifyAckDeadline extends, shortens and refuses out-of-range values', async () => {
  const {topic, subscription} = await topicAndSubscription({ackDeadlineSeconds: 10});
  await topic.publishMessage({data: Buffer.from('lease')});
  const pull = async () => {
    const [response] = await subscriberApi.pull({subscription: subscription.name, maxMessages: 10});
    return response.receivedMessages;
  };
  const [first] = await pull();
  await subscriberApi.modifyAckDeadline({subscription: subscription.name, ackIds: [first.ackId], ackDeadlineSeconds: 600});
  await rejects(
    subscriberApi.modifyAckDeadline({subscription: subscription.name, ackIds: [first.ackId], ackDeadlineSeconds: 601}),
    INVALID_ARGUMENT,
    'a 601 s deadline'
  );
  assert.equal((await pull()).length, 0, 'a leased message is not handed out again');
  const shortened = Date.now();
  await subscriberApi.modifyAckDeadline({subscription: subscription.name, ackIds: [first.ackId], ackDeadlineSeconds: 1});
  let again = [];
  while (!again.length) again = await pull();
  assert.ok(Date.now() - shortened >= 900, 'redelivered once the 1 s lease ran out, not before');
  assert.equal(again[0].message.messageId, first.message.messageId);
  await subscriberApi.acknowledge({subscription: subscription.name, ackIds: [again[0].ackId]});
});

check('filters: only matching messages are delivered; a bad filter is refused', async () => {
  const {topic, subscription} = await topicAndSubscription({filter: 'attributes.lang = "en" AND NOT attributes:spam'});
  for (const [lang, spam] of [['fr', false], ['en', true], ['en', false]]) {
    await topic.publishMessage({data: Buffer.from(`${lang}${spam}`), attributes: spam ? {lang, spam: '1'} : {lang}});
  }
  const received = await receive(subscription, m => m.ack(), r => r.length >= 1);
  await sleep(300);
  assert.deepEqual(received.map(m => m.data.toString()), ['enfalse']);
  await rejects(topic.createSubscription(unique('sub'), {filter: 'attributes.lang = en'}), INVALID_ARGUMENT, 'a bad filter');
});

check('dead-lettering: after max delivery attempts the message moves to the dead-letter topic', async () => {
  const {topic: deadLetters, subscription: deadLetterSubscription} = await topicAndSubscription();
  const {topic, subscription} = await topicAndSubscription({
    deadLetterPolicy: {deadLetterTopic: deadLetters.name, maxDeliveryAttempts: 5},
  });
  await topic.publishMessage({data: Buffer.from('poison'), attributes: {kind: 'test'}});
  const attempts = [];
  const forwarded = [];
  deadLetterSubscription.on('message', m => {
    forwarded.push(m);
    m.ack();
  });
  try {
    await receive(subscription, m => { attempts.push(m.deliveryAttempt); m.nack(); }, () => forwarded.length > 0);
  } finally {
    await deadLetterSubscription.close();
  }
  assert.deepEqual(attempts, [1, 2, 3, 4, 5]);
  assert.equal(forwarded[0].data.toString(), 'poison');
  assert.equal(forwarded[0].attributes.kind, 'test');
  assert.equal(forwarded[0].attributes.CloudPubSubDeadLetterSourceDeliveryCount, '5');
  assert.equal(forwarded[0].attributes.CloudPubSubDeadLetterSourceSubscription, subscription.name.split('/').pop());
});

check('ordering: a key\'s messages arrive in order, many outstanding at once (batched delivery)', async () => {
  const {topic, subscription} = await topicAndSubscription({enableMessageOrdering: true}, {messageOrdering: true});
  const count = 500;
  const started = Date.now();
  await Promise.all(
    Array.from({length: count}, (_, n) => [
      topic.publishMessage({data: Buffer.from(String(n)), orderingKey: 'one'}),
      topic.publishMessage({data: Buffer.from(String(n)), orderingKey: 'two'}),
    ]).flat()
  );
  // No ack until all arrived: one-at-a-time delivery would stall at the first message.
  const received = await receive(subscription, () => {}, r => r.length >= 2 * count, 15000);
  const elapsed = (Date.now() - started) / 1000;
  received.forEach(m => m.ack());
  for (const key of ['one', 'two']) {
    const order = received.filter(m => m.orderingKey === key).map(m => Number(m.data.toString()));
    assert.deepEqual(order, Array.from({length: count}, (_, n) => n), `key ${key} in order`);
  }
  console.log(`# ordered: ${2 * count} messages of 2 keys in ${elapsed.toFixed(2)} s (${Math.round((2 * count) / elapsed)} msgs/s)`);
});

check('ordering: a nack redelivers that message and every later one of its key', async () => {
  const {topic, subscription} = await topicAndSubscription({enableMessageOrdering: true}, {messageOrdering: true});
  await Promise.all([0, 1, 2, 3, 4].map(n => topic.publishMessage({data: Buffer.from(`r${n}`), orderingKey: 'r'})));
  let nacked = false;
  const received = await receive(
    subscription,
    m => {
      if (m.data.toString() === 'r2' && !nacked) {
        nacked = true;
        m.nack();
      } else {
        m.ack();
      }
    },
    r => r.length >= 8
  );
  await sleep(300);
  assert.deepEqual(received.map(m => m.data.toString()), ['r0', 'r1', 'r2', 'r3', 'r4', 'r2', 'r3', 'r4']);
});

check('publish limits: the service\'s INVALID_ARGUMENT for oversized requests', async () => {
  const [created] = await pubsub.createTopic(unique('topic'));
  const topic = pubsub.topic(created.name);
  const refused = {
    'an 11 MiB message': {data: Buffer.alloc(11 * 1024 * 1024, 'x')},
    '101 attributes': {data: Buffer.from('x'), attributes: Object.fromEntries(Array.from({length: 101}, (_, i) => [`k${i}`, 'v']))},
    'a 257-byte attribute key': {data: Buffer.from('x'), attributes: {['k'.repeat(257)]: 'v'}},
    'a 1,025-byte attribute value': {data: Buffer.from('x'), attributes: {k: 'v'.repeat(1025)}},
  };
  for (const [what, message] of Object.entries(refused)) {
    await rejects(topic.publishMessage(message), INVALID_ARGUMENT, what);
  }
  const tooMany = Array.from({length: 1001}, () => ({data: Buffer.from('x')}));
  await rejects(publisherApi.publish({topic: topic.name, messages: tooMany}), INVALID_ARGUMENT, '1,001 messages in one request');
  const [accepted] = await publisherApi.publish({topic: topic.name, messages: tooMany.slice(1)});
  assert.equal(accepted.messageIds.length, 1000);
  const atLimits = Object.fromEntries(Array.from({length: 99}, (_, i) => [`k${i}`, 'v']));
  atLimits['k'.repeat(256)] = 'v'.repeat(1024);
  await topic.publishMessage({data: Buffer.from('x'), attributes: atLimits});
});

check('exactly-once delivery: acks are confirmed, and a superseded ack id is refused', async () => {
  const {topic, subscription} = await topicAndSubscription({enableExactlyOnceDelivery: true});
  await topic.publishMessage({data: Buffer.from('once')});
  // The generated client: a redelivery supersedes the first ack id, which then fails per id.
  const pull = async () => (await subscriberApi.pull({subscription: subscription.name, maxMessages: 1}))[0].receivedMessages;
  const [first] = await pull();
  await subscriberApi.modifyAckDeadline({subscription: subscription.name, ackIds: [first.ackId], ackDeadlineSeconds: 0});
  const [second] = await pull();
  assert.equal(second.message.messageId, first.message.messageId);
  const error = await rejects(
    subscriberApi.acknowledge({subscription: subscription.name, ackIds: [first.ackId]}),
    INVALID_ARGUMENT,
    'a superseded ack id'
  );
  assert.equal(error.reason, 'EXACTLY_ONCE_ACKID_FAILURE');
  assert.deepEqual(error.errorInfoMetadata, {[first.ackId]: 'PERMANENT_FAILURE_INVALID_ACK_ID'});
  await subscriberApi.acknowledge({subscription: subscription.name, ackIds: [second.ackId]});

  // The streaming subscriber: ackWithResponse fails for a superseded delivery, succeeds for the current one.
  await topic.publishMessage({data: Buffer.from('streamed')});
  const outcomes = [];
  const received = await receive(
    subscription,
    (m, all) => {
      if (all.length === 1) {
        // Nack through the generated client: the server redelivers while this message is unhandled.
        subscriberApi.modifyAckDeadline({subscription: subscription.name, ackIds: [m.ackId], ackDeadlineSeconds: 0});
      } else {
        // One at a time: in a shared request, clients count every id as failed if one is.
        const outcome = (which, promise) =>
          promise.then(response => outcomes.push([which, response]), failure => outcomes.push([which, failure.errorCode]));
        outcome('superseded', all[0].ackWithResponse()).then(() => outcome('current', m.ackWithResponse()));
      }
    },
    () => outcomes.length === 2
  );
  assert.equal(received[0].id, received[1].id);
  assert.deepEqual(Object.fromEntries(outcomes), {current: 'SUCCESS', superseded: 'INVALID'});
});

async function main() {
  let failed = 0;
  for (const {name, body} of checks) {
    const started = Date.now();
    try {
      await body();
      console.log(`ok - ${name} (${Date.now() - started} ms)`);
    } catch (error) {
      failed++;
      console.log(`not ok - ${name} (${Date.now() - started} ms)\n${String(error.stack || error).replace(/^/gm, '#   ')}`);
    }
  }
  await Promise.allSettled([publisherApi.close(), subscriberApi.close(), pubsub.close()]);
  console.log(failed ? `# ${failed} of ${checks.length} checks failed` : `# all ${checks.length} checks passed`);
  process.exit(failed ? 1 : 0);
}

main();
