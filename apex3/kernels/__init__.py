"Where apex3 leaves plain PyTorch: the fused loss, FP8 linears and experts, and the decode step's Triton kernels."
