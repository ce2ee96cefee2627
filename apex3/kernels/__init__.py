"Where apex3 leaves plain PyTorch: the fused loss, FP8 linears and experts, and the decode step's Triton kernels."
from .ce import triton_interpret, triton_interpreting   # the names the offload chapters import from the package
