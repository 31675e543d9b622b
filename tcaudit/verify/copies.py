"""What a verify run's copies of a script hold, and the model facts its patch is made with: shared by
the runner and the attribution plan (which patches the copies again, leaving rules out)."""

from __future__ import annotations

import os
from pathlib import Path

from tcaudit.config import Settings


def copy_name(script: Path) -> str:
    """The name of a run's copy of ``script``: its own, or for a notebook the script its code cells make
    (``train.ipynb`` runs as ``train.py``)."""
    from tcaudit.source.notebook import is_notebook

    return f"{script.stem}.py" if is_notebook(script) else script.name


def copy_bytes(source, text: str) -> bytes:
    """What a run's copy holds for ``text``, a version of ``source``'s (a :class:`SourceText`): the file's
    bytes; for a notebook its virtual script (the code cells in order, IPython lines masked as comments,
    tcaudit/source/notebook.py), which runs as a script."""
    return text.encode("utf-8") if source.notebook is not None else source.encode(text)


def audited_models(script: Path, settings: Settings):
    """What the model audit measures about the models ``script`` builds, as ``tcaudit fix`` passes it to
    its rules (channels_last, cudnn.benchmark, compile and the precision follow the model's FLOP shares),
    so that verify times the patch ``fix`` writes; None where the audit does not run."""
    from tcaudit.engine import audited_models_for

    return audited_models_for([script], settings).get(os.path.realpath(script))
