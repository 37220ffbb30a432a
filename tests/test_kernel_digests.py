"""Every kernel of a fixed corpus (tests/kernel_corpus.py: all pipelines, both targets, the
built-in formats, the activation kernels) prints exactly the IR and source it printed when the
digests were last written. generated/ pins the examples' Metal files; this pins the rest."""
from __future__ import annotations

import json

from kernel_corpus import DIGESTS, digests


def test_kernel_corpus_unchanged() -> None:
    expected = json.loads(DIGESTS.read_text())
    found = digests()
    assert sorted(found) == sorted(expected), "the corpus's kernel names changed"
    changed = sorted(name for name in found if found[name] != expected[name])
    assert not changed, (f"{len(changed)} kernels print differently: {changed[:8]}; if intended, "
                         "run `python tests/kernel_corpus.py --update` and say why in the commit")
