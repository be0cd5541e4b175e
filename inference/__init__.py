"""Mnemo's inference sidecar: model wrappers, batching, the Ray Serve app, its HTTP contract, a client.

``index`` and ``gateway`` reach the sidecar over HTTP, and import from this package only its public
surface (``tests/test_code_shape.py`` holds them to it):

- ``inference.client``: the client and its typed errors;
- ``inference.errors``: ``ErrorCode``, the one table of error codes the sidecar answers;
- ``inference.strict_json``: the strict JSON parser both HTTP services use for request bodies;
- ``inference.json_out``: the JSON encoder (orjson) of both services' JSON answers and the client's requests;
- ``inference.http_protocol``: coded answers to HTTP protocol errors, shared by both servers;
- ``inference.net``: free ports and readiness waits for the processes ``mnemo up`` starts;
- ``inference.images``: safe image decoding (byte, pixel and decompression-bomb limits);
- ``inference.eventloop``: the event loop every service runs on (uvloop unless ``RAG_UVLOOP=off``);
- ``inference.settings``: the settings mechanism every package declares its ``RAG_*`` variables with
  (``schema.settings`` re-exports it), and the sidecar's own settings;
- ``inference.ray_local``: a local Ray start that is tried again when its raylet registers late
  (the sidecar's, and the bulk jobs' ``--ray local``);
- ``inference.config`` and ``inference.encoders``, for the bulk image job's Ray Data actors alone,
  which run the model code in-process on the cluster's GPUs.

The package imports nothing itself (callers name the module, ``from inference.client import
SidecarClient``), so ``import inference.batching`` or ``inference.encoders`` pulls in neither aiohttp
nor anything else the client needs: the GPU benchmark runs the batcher and model code on bare CUDA
machines without them.
"""
