"""radixkv.workloads"""
