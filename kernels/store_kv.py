"""placeholder"""
from .reference import store_kv_ref as store_kv
