"""radixkv.kernels"""
