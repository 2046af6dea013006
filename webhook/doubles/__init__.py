"""Test doubles: stand-ins for what Muster talks to in a cluster, so that the real components run
on one machine for `muster demo`, the tests, e2e and the benchmarks.

- `emulator/`: the Kubernetes API server (real HTTP wire format, watches, admission webhooks);
- `webhooks.py`: HTTPS admission webhooks whose answers a test supplies, with their certificates;
- `fakenvml.py`: NVML (the agent's `Nvml`) answering from a recorded node or a built-in profile;
- `fakekubelet.py`: the kubelet's device manager over real gRPC.

Nothing that runs in a cluster imports this package (`.importlinter` checks it). The one
exception is `muster agent --fake-nvml`, which builds the fake NVML for nodes without GPUs; that is
why the image keeps `fakenvml.py` and leaves the rest out (see docs/architecture.md). Nothing is
imported here, so loading the fake NVML does not load the emulator.
"""
