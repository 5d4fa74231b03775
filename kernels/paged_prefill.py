"""placeholder"""
from .reference import paged_prefill_ref as paged_prefill
