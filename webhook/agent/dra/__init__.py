"""The node agent as a Kubernetes DRA driver (`gpu.muster.io`): the ResourceSlice of this node's
GPUs (`slices`, pure; `publisher`, the API edge), the claims' devices to prepare (`claims`, pure)
and the kubelet's plugin registration and DRA gRPC services (`driver`). The `.proto` files are
Muster's own writing of the kubelet's wire contract; `regen` regenerates their modules."""
