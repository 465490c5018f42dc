"""The Kafka messages the sidecar speaks, transcribed from Kafka's JSON message schemas.

Field names are the schemas' names in snake_case. Version ranges cover brokers
from Kafka 2.1 (Produce v7, Metadata v7, InitProducerId v1) to 4.x, which
removed Produce below v3. Produce starts at v3 here: older versions cannot carry
v2 record batches.
"""

from __future__ import annotations

from .schema import field as f
from .schema import message

PRODUCE = 0
METADATA = 3
SASL_HANDSHAKE = 17
API_VERSIONS = 18
INIT_PRODUCER_ID = 22
SASL_AUTHENTICATE = 36

ApiVersionsRequest = message("ApiVersionsRequest", API_VERSIONS, "0-4", "3+", [
    f("client_software_name", "string", "3+"),
    f("client_software_version", "string", "3+"),
])

ApiVersionsResponse = message("ApiVersionsResponse", API_VERSIONS, "0-4", "3+", [
    f("error_code", "int16"),
    f("api_keys", "[]ApiVersion", fields=[
        f("api_key", "int16"),
        f("min_version", "int16"),
        f("max_version", "int16"),
    ]),
    f("throttle_time_ms", "int32", "1+"),
    f("supported_features", "[]SupportedFeatureKey", "3+", tag=0, tagged="3+", fields=[
        f("name", "string", "3+"),
        f("min_version", "int16", "3+"),
        f("max_version", "int16", "3+"),
    ]),
    f("finalized_features_epoch", "int64", "3+", tag=1, tagged="3+", default=-1),
    f("finalized_features", "[]FinalizedFeatureKey", "3+", tag=2, tagged="3+", fields=[
        f("name", "string", "3+"),
        f("max_version_level", "int16", "3+"),
        f("min_version_level", "int16", "3+"),
    ]),
    f("zk_migration_ready", "bool", "3+", tag=3, tagged="3+", default=False),
])

MetadataRequest = message("MetadataRequest", METADATA, "0-12", "9+", [
    f("topics", "[]MetadataRequestTopic", nullable="1+", fields=[
        f("topic_id", "uuid", "10+"),
        f("name", "string", nullable="10+"),
    ]),
    f("allow_auto_topic_creation", "bool", "4+", default=True),
    f("include_cluster_authorized_operations", "bool", "8-10"),
    f("include_topic_authorized_operations", "bool", "8+"),
])

MetadataResponse = message("MetadataResponse", METADATA, "0-12", "9+", [
    f("throttle_time_ms", "int32", "3+"),
    f("brokers", "[]MetadataResponseBroker", fields=[
        f("node_id", "int32"),
        f("host", "string"),
        f("port", "int32"),
        f("rack", "string", "1+", nullable="1+", default=None),
    ]),
    f("cluster_id", "string", "2+", nullable="2+", default=None),
    f("controller_id", "int32", "1+", default=-1),
    f("topics", "[]MetadataResponseTopic", fields=[
        f("error_code", "int16"),
        f("name", "string", nullable="12+"),
        f("topic_id", "uuid", "10+"),
        f("is_internal", "bool", "1+", default=False),
        f("partitions", "[]MetadataResponsePartition", fields=[
            f("error_code", "int16"),
            f("partition_index", "int32"),
            f("leader_id", "int32"),
            f("leader_epoch", "int32", "7+", default=-1),
            f("replica_nodes", "[]int32"),
            f("isr_nodes", "[]int32"),
            f("offline_replicas", "[]int32", "5+"),
        ]),
        f("topic_authorized_operations", "int32", "8+", default=-2147483648),
    ]),
    f("cluster_authorized_operations", "int32", "8-10", default=-2147483648),
])

ProduceRequest = message("ProduceRequest", PRODUCE, "3-12", "9+", [
    f("transactional_id", "string", "3+", nullable="3+", default=None),
    f("acks", "int16"),
    f("timeout_ms", "int32"),
    f("topic_data", "[]TopicProduceData", fields=[
        f("name", "string"),
        f("partition_data", "[]PartitionProduceData", fields=[
            f("index", "int32"),
            f("records", "records", nullable="0+"),
        ]),
    ]),
])

ProduceResponse = message("ProduceResponse", PRODUCE, "3-12", "9+", [
    f("responses", "[]TopicProduceResponse", fields=[
        f("name", "string"),
        f("partition_responses", "[]PartitionProduceResponse", fields=[
            f("index", "int32"),
            f("error_code", "int16"),
            f("base_offset", "int64"),
            f("log_append_time_ms", "int64", "2+", default=-1),
            f("log_start_offset", "int64", "5+", default=-1),
            f("record_errors", "[]BatchIndexAndErrorMessage", "8+", fields=[
                f("batch_index", "int32", "8+"),
                f("batch_index_error_message", "string", "8+", nullable="8+", default=None),
            ]),
            f("error_message", "string", "8+", nullable="8+", default=None),
            f("current_leader", "LeaderIdAndEpoch", "10+", tag=0, tagged="10+", fields=[
                f("leader_id", "int32", "10+", default=-1),
                f("leader_epoch", "int32", "10+", default=-1),
            ]),
        ]),
    ]),
    f("throttle_time_ms", "int32", "1+"),
    f("node_endpoints", "[]NodeEndpoint", "10+", tag=0, tagged="10+", fields=[
        f("node_id", "int32", "10+"),
        f("host", "string", "10+"),
        f("port", "int32", "10+"),
        f("rack", "string", "10+", nullable="10+", default=None),
    ]),
])

InitProducerIdRequest = message("InitProducerIdRequest", INIT_PRODUCER_ID, "0-5", "2+", [
    f("transactional_id", "string", nullable="0+", default=None),
    f("transaction_timeout_ms", "int32"),
    f("producer_id", "int64", "3+", default=-1),
    f("producer_epoch", "int16", "3+", default=-1),
])

InitProducerIdResponse = message("InitProducerIdResponse", INIT_PRODUCER_ID, "0-5", "2+", [
    f("throttle_time_ms", "int32"),
    f("error_code", "int16"),
    f("producer_id", "int64", default=-1),
    f("producer_epoch", "int16"),
])

# SASL's two requests: encoded and tested, not sent yet (security.protocol is PLAINTEXT only; the
# NetworkClient's AUTHENTICATING state is where SASL_PLAINTEXT and SASL_SSL will send them).
SaslHandshakeRequest = message("SaslHandshakeRequest", SASL_HANDSHAKE, "0-1", "none", [
    f("mechanism", "string"),
])

SaslHandshakeResponse = message("SaslHandshakeResponse", SASL_HANDSHAKE, "0-1", "none", [
    f("error_code", "int16"),
    f("mechanisms", "[]string"),
])

SaslAuthenticateRequest = message("SaslAuthenticateRequest", SASL_AUTHENTICATE, "0-2", "2+", [
    f("auth_bytes", "bytes"),
])

SaslAuthenticateResponse = message("SaslAuthenticateResponse", SASL_AUTHENTICATE, "0-2", "2+", [
    f("error_code", "int16"),
    f("error_message", "string", nullable="0+", default=None),
    f("auth_bytes", "bytes"),
    f("session_lifetime_ms", "int64", "1+"),
])
