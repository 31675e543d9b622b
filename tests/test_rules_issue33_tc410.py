"""TC410 dataset-rng-shared-by-workers, and TC401's fix declined over such a dataset.

Positive and near-miss cases on small scripts, the exact fixed text (compiled, and run on CPU with two
workers: the original's workers draw the same numbers, the fixed one's do not), the declined fixes
with their reasons, and how TC401/TC404 treat a DataLoader without workers over such a dataset."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from helpers import scan_code
from tcaudit.config import Settings
from tcaudit.findings import FixClass, Severity
from tcaudit.fix.engine import fix_file

TC401_REASON = (
    "the dataset's own random generator would repeat in every worker: reseed it in worker_init_fn first (TC410)"
)


def _hits(tmp_path, code, rule="TC410", select=None):
    return [f for f in scan_code(tmp_path, code, select=select or (rule,)).findings if f.rule == rule]


def _fixed(tmp_path, code, select=("TC410",)) -> str:
    path = tmp_path / "fixme.py"
    path.write_text(textwrap.dedent(code).lstrip("\n"), encoding="utf-8")
    result = fix_file(path, Settings(select=select))
    assert result.error is None
    compile(result.fixed, str(path), "exec")
    path.write_text(result.fixed, encoding="utf-8")
    assert not fix_file(path, Settings(select=select)).changed  # idempotent
    return result.fixed


def _script(dataset: str, loader: str = "DataLoader(Aug(0), batch_size=8, num_workers=4)", head: str = "") -> str:
    """A training script around a dataset class and a DataLoader expression."""
    return (
        "import random\nimport numpy as np\nimport torch\nfrom torch.utils.data import DataLoader, Dataset\n"
        + head
        + "\n\n"
        + textwrap.dedent(dataset).strip("\n")
        + "\n\n\n"
        + f"loader = {loader}\n"
        + "for x in loader:\n    loss = model(x).mean()\n    loss.backward()\n    optimizer.step()\n"
    )


NUMPY_AUG = """
class Aug(Dataset):
    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)

    def __len__(self):
        return 100

    def __getitem__(self, i):
        return torch.tensor(self.rng.random(4), dtype=torch.float32)
"""


# -- reported ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("creation,draw", [
    ("np.random.default_rng(seed)", "self.rng.random(4)"),
    ("np.random.RandomState(seed)", "self.rng.rand(4)"),
    ("np.random.Generator(np.random.PCG64(seed))", "self.rng.random(4)"),
    ("random.Random(seed)", "[self.rng.random() for _ in range(4)]"),
    ("torch.Generator().manual_seed(seed)", "torch.rand(4, generator=self.rng)"),
    ("np.random.default_rng()", "self.rng.random(4)"),  # unseeded: seeded once, in the main process
])
def test_generator_kinds_are_reported(tmp_path, creation, draw):
    dataset = f"""
    class Aug(Dataset):
        def __init__(self, seed):
            self.rng = {creation}

        def __len__(self):
            return 100

        def __getitem__(self, i):
            return torch.tensor({draw}, dtype=torch.float32)
    """
    [hit] = _hits(tmp_path, _script(dataset))
    assert hit.severity is Severity.WARNING
    assert hit.fix.fix_class is FixClass.NUMERICS and hit.fix.available, hit.fix.reason
    assert "`Aug.rng`" in hit.message and len(hit.message) <= 120
    assert "Randomness in multi-process data loading" in hit.explanation


@pytest.mark.parametrize("loader", [
    "DataLoader(Aug(0), batch_size=8, num_workers=args.workers)",
    "DataLoader(Aug(0), 8, True, None, None, 4)",  # num_workers positional
    "DataLoader(Aug(0), batch_size=8, num_workers=4, persistent_workers=True)",
    "DataLoader(Aug(0), batch_size=8, num_workers=4 if use_cuda else 0)",
    "DataLoader(Aug(0), batch_size=8, num_workers=4, worker_init_fn=None)",
    "torch.utils.data.DataLoader(Aug(0), batch_size=8, num_workers=4)",
])
def test_loader_shapes_with_workers_are_reported(tmp_path, loader):
    assert len(_hits(tmp_path, _script(NUMPY_AUG, loader))) == 1


def test_dataset_through_a_name_a_helper_parameter_and_a_kwargs_dict(tmp_path):
    code = _script(NUMPY_AUG, "make_loader(train_set)").replace(
        "loader = make_loader(train_set)",
        "def make_loader(ds):\n    kw = {'batch_size': 8, 'num_workers': 4}\n    return DataLoader(ds, **kw)\n\n\n"
        "train_set = Aug(0)\nloader = make_loader(train_set)",
    )
    [hit] = _hits(tmp_path, code)
    assert not hit.fix.available and "**kwargs" in hit.fix.reason


def test_generator_in_a_base_class_and_used_in_a_called_method(tmp_path):
    dataset = """
    class Base(Dataset):
        def __init__(self, seed):
            self.g = torch.Generator()
            self.g.manual_seed(seed)


    class Aug(Base):
        def __len__(self):
            return 100

        def noise(self):
            return torch.randn(4, generator=self.g)

        def sample(self, i):
            return self.noise() + i

        def __getitem__(self, i):
            return self.sample(i)
    """
    [hit] = _hits(tmp_path, _script(dataset))
    assert "`Aug.g`" in hit.message and hit.fix.available


# -- near misses --------------------------------------------------------------------------------------


@pytest.mark.parametrize("dataset", [
    # numpy's and torch's global RNGs: PyTorch seeds them per worker
    """
    class Aug(Dataset):
        def __len__(self):
            return 100

        def __getitem__(self, i):
            return torch.rand(4) + torch.tensor(np.random.rand(4), dtype=torch.float32)
    """,
    # a generator never read in __getitem__
    """
    class Aug(Dataset):
        def __init__(self, seed):
            self.rng = np.random.default_rng(seed)
            self.order = self.rng.permutation(100)

        def __len__(self):
            return 100

        def __getitem__(self, i):
            return torch.full((4,), float(self.order[i]))
    """,
    # made lazily in the worker
    """
    class Aug(Dataset):
        def __init__(self, seed):
            self.rng = None

        def __len__(self):
            return 100

        def __getitem__(self, i):
            if self.rng is None:
                self.rng = np.random.default_rng()
            return torch.tensor(self.rng.random(4), dtype=torch.float32)
    """,
    # reseeded from the worker's torch seed in a hook of its own
    """
    class Aug(Dataset):
        def __init__(self, seed):
            self.rng = np.random.default_rng(seed)

        def __len__(self):
            return 100

        def reseed(self):
            self.rng = np.random.default_rng(torch.initial_seed())

        def __getitem__(self, i):
            return torch.tensor(self.rng.random(4), dtype=torch.float32)
    """,
    # reseeded per sample: the draws depend on the index, not on the worker
    """
    class Aug(Dataset):
        def __init__(self, seed):
            self.rng = random.Random(seed)

        def __len__(self):
            return 100

        def __getitem__(self, i):
            self.rng.seed(i)
            return torch.tensor([self.rng.random() for _ in range(4)])
    """,
    # a generator handed in by the caller: its kind is not this file's to know
    """
    class Aug(Dataset):
        def __init__(self, rng):
            self.rng = rng

        def __len__(self):
            return 100

        def __getitem__(self, i):
            return torch.tensor(self.rng.random(4), dtype=torch.float32)
    """,
    # numpy's global state stored under a name
    """
    class Aug(Dataset):
        def __init__(self, seed):
            np.random.seed(seed)
            self.rng = np.random

        def __len__(self):
            return 100

        def __getitem__(self, i):
            return torch.tensor(self.rng.rand(4), dtype=torch.float32)
    """,
    # the class controls its own pickling
    """
    class Aug(Dataset):
        def __init__(self, seed):
            self.rng = np.random.default_rng(seed)

        def __setstate__(self, state):
            self.__dict__.update(state)
            self.rng = np.random.default_rng()

        def __len__(self):
            return 100

        def __getitem__(self, i):
            return torch.tensor(self.rng.random(4), dtype=torch.float32)
    """,
])
def test_dataset_near_misses_stay_silent(tmp_path, dataset):
    assert _hits(tmp_path, _script(dataset)) == []


@pytest.mark.parametrize("loader", [
    "DataLoader(Aug(0), batch_size=8, num_workers=4, worker_init_fn=seed_worker)",
    "DataLoader(Aug(0), batch_size=8, num_workers=0)",
    "DataLoader(Aug(0), batch_size=8)",
    "DataLoader(Aug(0), batch_size=8, **loader_kwargs)",  # an untraceable dict may pass worker_init_fn
    "DataLoader(other_set, batch_size=8, num_workers=4)",
    "DataLoader(Imported(0), batch_size=8, num_workers=4)",
])
def test_loader_near_misses_stay_silent(tmp_path, loader):
    assert _hits(tmp_path, _script(NUMPY_AUG, loader, head="from mydata import Imported\n")) == []


def test_the_samplers_generator_and_an_eval_loader_stay_silent(tmp_path):
    dataset = """
    class Aug(Dataset):
        def __init__(self, seed):
            self.g = torch.Generator().manual_seed(seed)

        def __len__(self):
            return 100

        def __getitem__(self, i):
            return torch.rand(4, generator=self.g)
    """
    code = _script(dataset, "DataLoader(ds, batch_size=8, shuffle=True, num_workers=4, generator=ds.g)")
    assert _hits(tmp_path, code.replace("loader = ", "ds = Aug(0)\nloader = ")) == []
    code = _script(NUMPY_AUG, "DataLoader(train_set, num_workers=4)") + "val_loader = DataLoader(Aug(1), num_workers=4)\n"
    assert _hits(tmp_path, code) == []


def test_no_training_in_the_file_stays_silent(tmp_path):
    code = _script(NUMPY_AUG).split("for x in loader")[0] + "for x in loader:\n    print(x.sum())\n"
    assert _hits(tmp_path, code) == []


# -- the fix --------------------------------------------------------------------------------------


def test_fix_with_an_aliased_constructor_and_two_loaders_over_one_class(tmp_path):
    code = """
    import torch
    from numpy.random import default_rng as make_rng
    from torch.utils.data import DataLoader, Dataset


    class Aug(Dataset):
        def __init__(self, seed):
            self.rng = make_rng(seed)

        def __len__(self):
            return 100

        def __getitem__(self, i):
            return torch.tensor(self.rng.random(4), dtype=torch.float32)


    def main():
        a = DataLoader(Aug(0), batch_size=8, num_workers=4)
        b = DataLoader(Aug(1), batch_size=8, num_workers=2)
        for x, y in zip(a, b):
            loss = model(x + y).mean()
            loss.backward()
            optimizer.step()
    """
    assert _fixed(tmp_path, code) == textwrap.dedent("""\
    import torch
    from numpy.random import default_rng as make_rng
    from torch.utils.data import DataLoader, Dataset


    class Aug(Dataset):
        def __init__(self, seed):
            self.rng = make_rng(seed)

        def __len__(self):
            return 100

        def __getitem__(self, i):
            return torch.tensor(self.rng.random(4), dtype=torch.float32)


    def _tcaudit_seed_worker(worker_id):
        # Each worker gets a copy of Aug with the same generator state: reseed it (TC410).
        info = torch.utils.data.get_worker_info()
        info.dataset.rng = make_rng(info.seed)


    def main():
        a = DataLoader(Aug(0), batch_size=8, num_workers=4, worker_init_fn=_tcaudit_seed_worker)
        b = DataLoader(Aug(1), batch_size=8, num_workers=2, worker_init_fn=_tcaudit_seed_worker)
        for x, y in zip(a, b):
            loss = model(x + y).mean()
            loss.backward()
            optimizer.step()
    """)


def test_fix_randomstate_replaces_worker_init_fn_none_and_uses_torch_alias(tmp_path):
    code = """
    import numpy as np
    import torch as T
    from torch.utils.data import DataLoader, Dataset


    class Aug(Dataset):
        def __init__(self, seed):
            self.state = np.random.RandomState(seed)

        def __len__(self):
            return 100

        def __getitem__(self, i):
            return T.tensor(self.state.rand(4), dtype=T.float32)


    loader = DataLoader(Aug(0), batch_size=8, num_workers=4, worker_init_fn=None)
    for x in loader:
        loss = model(x).mean()
        loss.backward()
        optimizer.step()
    """
    fixed = _fixed(tmp_path, code)
    assert "    info = T.utils.data.get_worker_info()\n" in fixed
    assert "    info.dataset.state = np.random.RandomState(info.seed % 2**32)\n" in fixed
    assert "num_workers=4, worker_init_fn=_tcaudit_seed_worker)" in fixed and "None" not in fixed


def test_helper_name_avoids_the_files_own_and_two_classes_get_two_helpers(tmp_path):
    code = _script(NUMPY_AUG, "DataLoader(Aug(0), num_workers=4)") + textwrap.dedent("""
    def _tcaudit_seed_worker():
        pass


    class Other(Dataset):
        def __init__(self):
            self.r = random.Random(0)

        def __len__(self):
            return 10

        def __getitem__(self, i):
            return torch.tensor([self.r.random()])


    other = DataLoader(Other(), num_workers=2)
    for x in other:
        loss = model(x).mean()
        loss.backward()
        optimizer.step()
    """)
    fixed = _fixed(tmp_path, code)
    assert "def _tcaudit_seed_worker2(worker_id):\n" in fixed and "def _tcaudit_seed_worker3(worker_id):\n" in fixed
    assert "DataLoader(Aug(0), num_workers=4, worker_init_fn=_tcaudit_seed_worker2)" in fixed
    assert "DataLoader(Other(), num_workers=2, worker_init_fn=_tcaudit_seed_worker3)" in fixed
    assert fixed.index("def _tcaudit_seed_worker3") > fixed.index("class Other")


@pytest.mark.parametrize("dataset,loader,reason", [
    (NUMPY_AUG, "DataLoader(torch.utils.data.Subset(Aug(0), range(50)), num_workers=4)", "wrapper of the dataset"),
    (NUMPY_AUG, "DataLoader(Aug(0) if flag else plain_set, num_workers=4)", "another dataset"),
    ("""
    class Aug(Dataset):
        def __init__(self, seed):
            self.rng = np.random.default_rng(seed) if seed is not None else random.Random()

        def __len__(self):
            return 100

        def __getitem__(self, i):
            return torch.tensor([self.rng.random()])
    """, "DataLoader(Aug(0), num_workers=4)", "kind is unclear"),
    ("""
    class Aug(Dataset):
        def __init__(self, seed):
            self.a = np.random.default_rng(seed)
            self.b = np.random.default_rng(seed + 1)

        def __len__(self):
            return 100

        def __getitem__(self, i):
            return torch.tensor([self.a.random(), self.b.random()])
    """, "DataLoader(Aug(0), num_workers=4)", "several generators of one kind"),
    ("""
    class Aug(Dataset):
        def __init__(self, seed):
            self.g = torch.Generator(device="cpu")

        def __len__(self):
            return 100

        def __getitem__(self, i):
            return torch.rand(4, generator=self.g)
    """, "DataLoader(Aug(0), num_workers=4)", "takes arguments"),
])
def test_declined_fixes(tmp_path, dataset, loader, reason):
    [hit] = _hits(tmp_path, _script(dataset, loader))
    assert not hit.fix.available and reason in hit.fix.reason, hit.fix.reason


def test_fix_declined_for_a_class_defined_in_a_function(tmp_path):
    code = """
    import numpy as np
    import torch
    from torch.utils.data import DataLoader, Dataset


    def main():
        class Aug(Dataset):
            def __init__(self, seed):
                self.rng = np.random.default_rng(seed)

            def __len__(self):
                return 100

            def __getitem__(self, i):
                return torch.tensor(self.rng.random(4))

        for x in DataLoader(Aug(0), num_workers=4):
            loss = model(x).mean()
            loss.backward()
            optimizer.step()
    """
    [hit] = _hits(tmp_path, textwrap.dedent(code))
    assert not hit.fix.available and "not defined at module level" in hit.fix.reason


# -- TC401 (no workers) over such a dataset -----------------------------------------------------------


NO_WORKERS = """
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset


class Aug(Dataset):
    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)

    def __len__(self):
        return 100

    def __getitem__(self, i):
        return torch.tensor(self.rng.random(4), dtype=torch.float32)


def main():
    loader = DataLoader(Aug(0), batch_size=8, shuffle=True{extra})
    for epoch in range(3):
        for x in loader:
            loss = model(x.cuda()).mean()
            loss.backward()
            optimizer.step()


if __name__ == "__main__":
    main()
"""


def test_tc401_declines_to_add_workers_and_tc404_stays_silent(tmp_path):
    code = NO_WORKERS.format(extra="")
    [tc401] = _hits(tmp_path, code, "TC401")
    assert not tc401.fix.available and tc401.fix.reason == TC401_REASON
    assert _hits(tmp_path, code, "TC404", select=("TC401", "TC404")) == []  # no workers coming: nothing to keep
    assert _hits(tmp_path, code) == []  # TC410 speaks once the loader has workers
    path = tmp_path / "train.py"
    path.write_text(code, encoding="utf-8")
    result = fix_file(path, Settings(select=("TC4",)))
    assert result.error is None and "num_workers" not in result.fixed and "persistent_workers" not in result.fixed


def test_tc401_fixes_once_worker_init_fn_reseeds(tmp_path):
    code = NO_WORKERS.format(extra=", worker_init_fn=seed_worker")
    [tc401] = _hits(tmp_path, code, "TC401")
    assert tc401.fix.available
    fixed = _fixed(tmp_path, code, select=("TC401",))
    assert "worker_init_fn=seed_worker, num_workers=min(16, os.cpu_count() or 1))" in fixed


def test_tc401_still_fixes_a_dataset_without_its_own_generator(tmp_path):
    code = NO_WORKERS.format(extra="").replace("self.rng = np.random.default_rng(seed)", "self.seed = seed").replace(
        "self.rng.random(4)", "np.random.rand(4)"
    )
    [tc401] = _hits(tmp_path, code, "TC401")
    assert tc401.fix.available


# -- the fixed script, run with two workers ---------------------------------------------------------------


RUNNABLE = """
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset


class Draws(Dataset):
    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)

    def __len__(self):
        return 8

    def __getitem__(self, i):
        return torch.tensor([self.rng.random()])


def main():
    model = torch.nn.Linear(1, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(Draws(0), batch_size=1, num_workers=2)
    draws = []
    for x in loader:
        draws.append(round(float(x), 6))
        loss = model(x).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print("draws", draws)


if __name__ == "__main__":
    main()
"""


def _draws(path, tmp_path) -> list[float]:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(line for line in proc.stdout.splitlines() if line.startswith("draws"))
    return eval(line[len("draws "):])  # noqa: S307 - a list of floats this test printed


def test_the_workers_repeat_before_the_fix_and_not_after(tmp_path):
    original = tmp_path / "original.py"
    original.write_text(RUNNABLE.lstrip("\n"), encoding="utf-8")
    before = _draws(original, tmp_path)
    # Batches alternate between the two workers: worker 1's j-th draw is worker 0's j-th draw.
    assert before[0::2] == before[1::2]
    fixed = tmp_path / "fixed.py"
    fixed.write_text(_fixed(tmp_path, RUNNABLE), encoding="utf-8")
    after = _draws(fixed, tmp_path)
    assert after[0::2] != after[1::2] and len(set(after)) == len(after)
