// nf4 kernels: filled in by the kernel author.
