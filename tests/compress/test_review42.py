"""The float16 codecs never import torch themselves: the import, on a codec's first use,
held a peer's event loop for 1.4-2.2 s in its first fp16 round."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
from swarmtest import ROOT

from swarm.compress import get_codec

SPECS = ["fp16", "topk:0.1:values=fp16", "ef+topk:0.15:values=fp16"]

PROGRAM = textwrap.dedent("""
    import sys
    import numpy as np
    from swarm.compress import get_codec
    x = (np.random.default_rng(0).standard_normal(10_000) * 100).astype(np.float32)
    for spec in sys.argv[1:]:
        c = get_codec(spec)
        out = c.decode(c.encode(x))
        sys.stdout.buffer.write(np.ascontiguousarray(out, np.float32).tobytes())
    sys.stderr.write(f"torch imported: {'torch' in sys.modules}")
""")


def test_fp16_codecs_use_numpy_without_importing_torch_and_give_the_same_values():
    out = subprocess.run([sys.executable, "-c", PROGRAM, *SPECS], cwd=ROOT, capture_output=True, timeout=60)
    assert out.returncode == 0, out.stderr.decode()
    assert out.stderr.decode() == "torch imported: False"
    got = np.frombuffer(out.stdout, np.float32).reshape(len(SPECS), -1)
    import torch  # noqa: F401 - from here on the codecs cast through torch
    x = (np.random.default_rng(0).standard_normal(10_000) * 100).astype(np.float32)
    for spec, row in zip(SPECS, got):
        c = get_codec(spec)
        assert np.array_equal(np.asarray(c.decode(c.encode(x))), row), spec
