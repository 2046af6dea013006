"""Kubelet PodResources API v1 (generated api_pb2*): what each pod's containers hold."""
