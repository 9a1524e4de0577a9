"""gRPC, the second transport: the server (server.py), what every call goes through
(calls.py: key, readiness, deadline, metrics, trace, statuses), and the code generated from
the vendored protos (protos/, generated/). The services themselves live with their dialects:
service/api/oip/rpc.py and service/api/tei/rpc.py."""
