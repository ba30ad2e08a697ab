// embedding kernels: filled in by the kernel author.
