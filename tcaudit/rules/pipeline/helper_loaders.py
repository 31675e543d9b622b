"""Training DataLoaders that a helper of another module builds (``utils.get_data(args)``): the pipeline
rules report them at the script's call, with the DataLoader as a mirrored related place, and make the
fix in the helper's module (``tcaudit fix train.py`` edits that module too: :func:`tcaudit.fix.engine.fixed_elsewhere`)."""

from __future__ import annotations

from tcaudit.findings import Fix, FixClass
from tcaudit.project.loaders import HelperLoader


def fix_in_helper(loader: HelperLoader, fix_class: FixClass, description: str) -> Fix:
    """The script's side of the fix: declined here, made in the module that builds the DataLoader."""
    return Fix(
        fix_class, description, available=False,
        reason=f"the DataLoader is built in {loader.where} (`{loader.helper.name}`), another module: the fix belongs "
        f"there (`tcaudit fix` of this script makes it in "
        f"{loader.pipeline.facts.source.display_path} where that is safe)",
    )
