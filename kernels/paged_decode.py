"""placeholder"""
from .reference import paged_decode_ref as paged_decode
