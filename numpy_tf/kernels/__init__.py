"""The kernel tier: the code models run, kept apart from the reference functions a student reads.

Each module here computes what one layer family's reference computes (numpy_tf.layers, and
numpy_tf.core.special for erf), only faster: in cache-sized blocks on worker threads, in place,
into given arrays, or with its input checks done once by the caller. Each kernel is tested equal
to its reference (tests/test_kernels.py): bit for bit where the arithmetic is the same, within a
stated number of ulps where it is reordered. The layer classes run the kernels unless the caller
is inside `numpy_tf.reference_path()`.

    blocks.py      map_blocks: consecutive blocks of an array on NUMPY_TF_NUM_THREADS threads
    erf.py         erf and erfc in blocks, in place (numpy_tf.core.special is the reference)
    gelu.py        GELU's forward and backward in blocks (layers.activations)
    linear.py      Linear's forward for inputs checked by the class, its backward added
                   straight into the Parameters' gradients; a norm's output kept as what
                   rebuilds it (fed_by_norm) (layers.linear)
    norm.py        LayerNorm and RMSNorm with one-pass row statistics; NormOutput, the
                   arrays that rebuild a norm's output (layers.norm)
    attention.py   attention's forward and backward in cache-sized chunks of the batch, the
                   backward into given arrays; the fused qkv gradient (layers.attention,
                   layers.multihead)
    embedding.py   Embedding's backward added straight into the weight's gradient
                   (layers.embedding)

Kernels import only numpy_tf.core; the layers import the kernels.
"""
