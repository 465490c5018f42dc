"""Test support: real peers (Tansu, librdkafka's mock cluster), a verifier, fault proxies."""
