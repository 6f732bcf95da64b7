"""The gRPC face of the emulator: `google.pubsub.v1` Publisher and Subscriber on a Broker.

Handlers are plain functions registered with `grpc.method_handlers_generic_handler`
and (de)serialized with the protobuf classes inside google-cloud-pubsub, so no
generated stubs are needed. Every call is logged at debug level; anything not
implemented (snapshots, seek, schemas, IAM) answers UNIMPLEMENTED.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Iterator

import grpc
from google.protobuf import empty_pb2, text_format

from localpubsub.names import EmulatorError
from localpubsub.protos import raw
from localpubsub.state import Broker, Stream

log = logging.getLogger("localpubsub.emulator")

Empty = empty_pb2.Empty
_PULL_MARGIN = 0.25  # seconds a waiting Pull leaves before the client's deadline


def _describe(request) -> str:
    if isinstance(request, raw("PublishRequest")):  # payloads can be megabytes: summarize
        return f'topic: "{request.topic}" messages: {len(request.messages)}'
    text = text_format.MessageToString(request, as_one_line=True)
    return text if len(text) <= 300 else text[:300] + "..."


def _rich_status(error: EmulatorError):
    """The status with google.rpc details, as the service sends them (clients read per-id errors)."""
    from google.protobuf import any_pb2
    from google.rpc import status_pb2
    from grpc_status import rpc_status

    details = []
    for detail in error.details:
        packed = any_pb2.Any()
        packed.Pack(detail)
        details.append(packed)
    return rpc_status.to_status(status_pb2.Status(code=error.code.value[0], message=error.message, details=details))


def _unary(method: str, behaviour: Callable, request_type: str, response_type) -> grpc.RpcMethodHandler:
    """A unary handler that logs the call and turns EmulatorError into its status."""

    def handle(request, context):
        if log.isEnabledFor(logging.DEBUG):
            log.debug("%s(%s)", method, _describe(request))
        try:
            return behaviour(request, context)
        except EmulatorError as error:
            log.debug("%s -> %s: %s", method, error.code.name, error.message)
            if error.details:
                context.abort_with_status(_rich_status(error))
            context.abort(error.code, error.message)

    response_class = raw(response_type) if isinstance(response_type, str) else response_type
    return grpc.unary_unary_rpc_method_handler(
        handle,
        request_deserializer=raw(request_type).FromString,
        response_serializer=response_class.SerializeToString,
    )


class PublisherService:
    """google.pubsub.v1.Publisher: topic admin and Publish."""

    NAME = "google.pubsub.v1.Publisher"

    def __init__(self, broker: Broker):
        self.broker = broker

    def handler(self) -> grpc.GenericRpcHandler:
        return grpc.method_handlers_generic_handler(
            self.NAME,
            {
                "CreateTopic": _unary("CreateTopic", self.create_topic, "Topic", "Topic"),
                "UpdateTopic": _unary("UpdateTopic", self.update_topic, "UpdateTopicRequest", "Topic"),
                "Publish": _unary("Publish", self.publish, "PublishRequest", "PublishResponse"),
                "GetTopic": _unary("GetTopic", self.get_topic, "GetTopicRequest", "Topic"),
                "ListTopics": _unary("ListTopics", self.list_topics, "ListTopicsRequest", "ListTopicsResponse"),
                "ListTopicSubscriptions": _unary(
                    "ListTopicSubscriptions",
                    self.list_topic_subscriptions,
                    "ListTopicSubscriptionsRequest",
                    "ListTopicSubscriptionsResponse",
                ),
                "DeleteTopic": _unary("DeleteTopic", self.delete_topic, "DeleteTopicRequest", Empty),
            },
        )

    def create_topic(self, request, context):
        return self.broker.create_topic(request)

    def update_topic(self, request, context):
        return self.broker.update_topic(request.topic, request.update_mask)

    def publish(self, request, context):
        ids = self.broker.publish(request.topic, request.messages)
        return raw("PublishResponse")(message_ids=ids)

    def get_topic(self, request, context):
        return self.broker.get_topic(request.topic)

    def list_topics(self, request, context):
        topics, token = self.broker.list_topics(request.project, request.page_size, request.page_token)
        return raw("ListTopicsResponse")(topics=topics, next_page_token=token)

    def list_topic_subscriptions(self, request, context):
        names, token = self.broker.list_topic_subscriptions(request.topic, request.page_size, request.page_token)
        return raw("ListTopicSubscriptionsResponse")(subscriptions=names, next_page_token=token)

    def delete_topic(self, request, context):
        self.broker.delete_topic(request.topic)
        return Empty()


class SubscriberService:
    """google.pubsub.v1.Subscriber: subscription admin, Pull, StreamingPull, acks."""

    NAME = "google.pubsub.v1.Subscriber"

    def __init__(self, broker: Broker, pull_wait: float):
        self.broker = broker
        self.pull_wait = pull_wait

    def handler(self) -> grpc.GenericRpcHandler:
        streaming_pull = grpc.stream_stream_rpc_method_handler(
            self.streaming_pull,
            request_deserializer=raw("StreamingPullRequest").FromString,
            response_serializer=raw("StreamingPullResponse").SerializeToString,
        )
        return grpc.method_handlers_generic_handler(
            self.NAME,
            {
                "CreateSubscription": _unary(
                    "CreateSubscription", self.create_subscription, "Subscription", "Subscription"
                ),
                "GetSubscription": _unary(
                    "GetSubscription", self.get_subscription, "GetSubscriptionRequest", "Subscription"
                ),
                "UpdateSubscription": _unary(
                    "UpdateSubscription", self.update_subscription, "UpdateSubscriptionRequest", "Subscription"
                ),
                "ListSubscriptions": _unary(
                    "ListSubscriptions", self.list_subscriptions, "ListSubscriptionsRequest", "ListSubscriptionsResponse"
                ),
                "DeleteSubscription": _unary(
                    "DeleteSubscription", self.delete_subscription, "DeleteSubscriptionRequest", Empty
                ),
                "ModifyAckDeadline": _unary(
                    "ModifyAckDeadline", self.modify_ack_deadline, "ModifyAckDeadlineRequest", Empty
                ),
                "Acknowledge": _unary("Acknowledge", self.acknowledge, "AcknowledgeRequest", Empty),
                "Pull": _unary("Pull", self.pull, "PullRequest", "PullResponse"),
                "StreamingPull": streaming_pull,
            },
        )

    def create_subscription(self, request, context):
        return self.broker.create_subscription(request)

    def get_subscription(self, request, context):
        return self.broker.get_subscription(request.subscription)

    def update_subscription(self, request, context):
        return self.broker.update_subscription(request.subscription, request.update_mask)

    def list_subscriptions(self, request, context):
        subscriptions, token = self.broker.list_subscriptions(request.project, request.page_size, request.page_token)
        return raw("ListSubscriptionsResponse")(subscriptions=subscriptions, next_page_token=token)

    def delete_subscription(self, request, context):
        self.broker.delete_subscription(request.subscription)
        return Empty()

    def modify_ack_deadline(self, request, context):
        self.broker.modify_ack_deadline(request.subscription, request.ack_ids, request.ack_deadline_seconds)
        return Empty()

    def acknowledge(self, request, context):
        self.broker.acknowledge(request.subscription, request.ack_ids)
        return Empty()

    def pull(self, request, context):
        # Wait briefly, never up to the client's deadline: pollers such as Beam's
        # DirectRunner would otherwise see DEADLINE_EXCEEDED instead of an empty answer.
        wait = 0.0 if request.return_immediately else self.pull_wait
        remaining = context.time_remaining()
        if remaining is not None:
            wait = max(0.0, min(wait, remaining - _PULL_MARGIN))
        response = self.broker.pull(request.subscription, request.max_messages, wait)
        log.debug("Pull -> %d message(s)", len(response.received_messages))
        return response

    def streaming_pull(self, requests: Iterator, context) -> Iterator:
        """Send leased messages as they become ready; acks arrive on a reader thread.

        The call never ends with OK: the Python client would then stop without a word.
        Shutdown and maximum age end it with UNAVAILABLE, which clients retry.
        """
        try:
            first = next(requests, None)
        except grpc.RpcError:
            return  # cancelled before saying anything
        if first is None:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "StreamingPull needs an initial request")
        if log.isEnabledFor(logging.DEBUG):
            log.debug("StreamingPull(%s)", _describe(first))
        try:
            stream = self.broker.open_stream(first)
        except EmulatorError as error:
            log.debug("StreamingPull -> %s: %s", error.code.name, error.message)
            context.abort(error.code, error.message)
        try:
            if not context.add_callback(functools.partial(self.broker.cancel_stream, stream)):
                return  # the call already ended
            threading.Thread(
                target=self._read_requests, args=(requests, stream), name="pubsub-emulator-stream-reader", daemon=True
            ).start()
            while True:
                try:
                    response = self.broker.next_response(stream)
                except EmulatorError as error:
                    log.debug("StreamingPull %s ends: %s %s", first.subscription, error.code.name, error.message)
                    context.abort(error.code, error.message)
                if response is None:
                    return  # the client cancelled: nobody is listening for a status
                log.debug("StreamingPull -> %d message(s)", len(response.received_messages))
                yield response
        finally:
            self.broker.close_stream(stream)

    def _read_requests(self, requests: Iterator, stream: Stream) -> None:
        try:
            for request in requests:
                if log.isEnabledFor(logging.DEBUG):
                    log.debug("StreamingPull request (%s)", _describe(request) or "heartbeat")
                self.broker.stream_request(stream, request)
        except EmulatorError as error:
            self.broker.fail_stream(stream, error)
        except grpc.RpcError:
            pass  # the call ended; its sender notices through the cancel callback


class UnimplementedHandler(grpc.GenericRpcHandler):
    """Catch-all after the real services: UNIMPLEMENTED, with the method's name, for the rest."""

    def service(self, handler_call_details):
        method = handler_call_details.method

        def abort(request_iterator, context):
            log.debug("%s -> UNIMPLEMENTED", method)
            context.abort(grpc.StatusCode.UNIMPLEMENTED, f"{method} is not supported by the ChatLens emulator")

        return grpc.stream_stream_rpc_method_handler(abort)


def generic_handlers(broker: Broker, pull_wait: float) -> list[grpc.GenericRpcHandler]:
    return [PublisherService(broker).handler(), SubscriberService(broker, pull_wait).handler(), UnimplementedHandler()]
