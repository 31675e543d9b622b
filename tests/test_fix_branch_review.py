"""Where the second group of codemods edits relative to the paths of the script (TC209, TC508,
TC603; TC201/TC204's device and flag tests are in the fixtures tc201_cuda_flag_moves,
tc204_cpu_unless_cuda, tc204_two_fp16_arms and tc209_apex_amp_flag): an edit that cannot hold on
every path the anchor runs on is declined with the reason, and the file stays as it was."""

from __future__ import annotations

import json
import textwrap

from helpers import scan_code
from tcaudit.config import Settings
from tcaudit.fix.engine import fix_file
from tcaudit.runtime_facts import text_digest


def _fix_declined(tmp_path, text: str, rule: str, reason: str) -> None:
    result = scan_code(tmp_path, text, select=(rule,))
    (finding,) = [f for f in result.findings if f.fix is not None and not f.fix.available]
    assert reason in finding.fix.reason
    path = tmp_path / "train.py"
    before = path.read_bytes()
    fixed = fix_file(path, Settings(select=(rule,), root=tmp_path))
    assert not fixed.changed and path.read_bytes() == before


def test_tc603_len_of_a_name_that_is_a_dataloader_on_one_path_only_is_declined(tmp_path):
    """``len(loader)`` raises where the other arm bound a generator."""
    _fix_declined(tmp_path, '''
        import torch
        from torch.utils.data import DataLoader, TensorDataset

        def stream():
            yield torch.zeros(2)

        def main(flag):
            if flag:
                loader = DataLoader(TensorDataset(torch.zeros(8, 2)), batch_size=2)
            else:
                loader = stream()
            print(len(list(loader)))
    ''', "TC603", "a DataLoader on some paths only")


def test_tc603_len_through_a_conditional_expression_is_declined(tmp_path):
    _fix_declined(tmp_path, '''
        import torch
        from torch.utils.data import DataLoader, TensorDataset

        def stream():
            yield torch.zeros(2)

        def main(flag):
            loader = DataLoader(TensorDataset(torch.zeros(8, 2)), batch_size=2) if flag else stream()
            print(len(list(loader)))
    ''', "TC603", "a DataLoader on some paths only")


TC508_PER_PATH = textwrap.dedent('''
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP


    def wrap(model, local_rank, freeze_backbone):
        if freeze_backbone:
            model = DDP(model, device_ids=[local_rank], find_unused_parameters=True)
        else:
            model = DDP(model, device_ids=[local_rank])
        return model
''').lstrip()


def test_tc508_a_flag_chosen_per_path_is_kept_even_with_a_measured_run(tmp_path):
    """The verify run took one arm; with --freeze-backbone the frozen parameters get no gradient and
    DDP without the flag raises at the second step."""
    results = tmp_path / "tcaudit-verify"
    results.mkdir()
    (results / "verify.json").write_text(json.dumps({
        "script_sha256": text_digest(TC508_PER_PATH), "rounds": 3, "original": {"steps": 50},
        "health": {"original": {"unused_parameters": []}},
    }), encoding="utf-8")
    _fix_declined(tmp_path, TC508_PER_PATH, "TC508", "chosen per path")


def test_tc209_initialize_in_an_elif_arm_gets_a_disabled_scaler_before_the_whole_if(tmp_path):
    (tmp_path / "train.py").write_text(textwrap.dedent('''
        import torch
        from apex import amp

        def main(args, model, optimizer, loader):
            if args.cpu:
                pass
            elif args.amp:
                model, optimizer = amp.initialize(model, optimizer, opt_level="O1")
            for x in loader:
                loss = model(x).mean()
                optimizer.zero_grad()
                with amp.scale_loss(loss, optimizer) as scaled_loss:
                    scaled_loss.backward()
                optimizer.step()
    '''), encoding="utf-8")
    result = fix_file(tmp_path / "train.py", Settings(select=("TC209",), root=tmp_path))
    assert result.applied == ["TC209"]
    assert (
        '    scaler = torch.amp.GradScaler("cuda", enabled=False)\n    if args.cpu:\n        pass\n'
        '    elif args.amp:\n        scaler = torch.amp.GradScaler("cuda", enabled=True)\n'
    ) in result.fixed
