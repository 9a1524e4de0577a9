"""Code generated from ../protos by protos/generate.sh (do not edit): the Open Inference
Protocol's `inference.GRPCInferenceService` and TEI's `tei.v1` services.

Their descriptors live in POOL, not protobuf's default pool: a process that also imports
another copy of the same protos (tritonclient.grpc, tei-client) would otherwise fail with
"duplicate symbol". Server reflection is given this pool.
"""

from google.protobuf import descriptor_pool

POOL = descriptor_pool.DescriptorPool()
