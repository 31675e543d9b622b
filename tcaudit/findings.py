"""What a check reports: a rule id at a place, with a message and, where it has one, a fix."""

from __future__ import annotations

import dataclasses
import enum
import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

# The longest a finding's message may be (ruff-like: what and where); the why goes in its explanation.
MESSAGE_LIMIT = 120


class Severity(enum.IntEnum):
    INFO = 0
    WARNING = 1
    ERROR = 2

    @classmethod
    def parse(cls, text: str) -> "Severity":
        try:
            return cls[text.strip().upper()]
        except KeyError:
            raise ValueError(f"unknown severity {text!r} (expected info, warning or error)") from None

    def __str__(self) -> str:
        return self.name.lower()


class FixClass(str, enum.Enum):
    SAFE = "safe"
    NUMERICS = "numerics"
    STRUCTURAL = "structural"

    def __str__(self) -> str:
        return self.value


def parse_classes(text: str) -> frozenset[FixClass]:
    """``--classes safe,numerics`` as the set of fix classes; ValueError, with the message the command
    line prints, for an unknown or structural class or none at all."""
    out = set()
    for part in text.split(","):
        part = part.strip().lower()
        if not part:
            continue
        try:
            fix_class = FixClass(part)
        except ValueError:
            raise ValueError(f"unknown fix class {part!r} (expected safe, numerics)") from None
        if fix_class is FixClass.STRUCTURAL:
            raise ValueError("structural fixes are asked for by name: --ddp, --dali, --compile "
                             "(or structural-fixes in the config); --classes takes safe, numerics")
        out.add(fix_class)
    if not out:
        raise ValueError("--classes needs at least one of safe, numerics")
    return frozenset(out)


@dataclass(frozen=True, order=True)
class Location:
    """1-based line and column, end inclusive of the last character's line, exclusive column. In a
    Jupyter notebook, ``cell`` is the cell (1-based among all cells, markdown too, as ruff numbers them) and the
    lines are the cell's own (tcaudit/source/notebook.py); None in a script."""

    path: str
    line: int
    column: int
    end_line: int
    end_column: int
    cell: int | None = None

    @property
    def position(self) -> str:
        """``line:column``, or ``cell N:line:column`` in a notebook (ruff's format)."""
        where = f"{self.line}:{self.column}"
        return f"cell {self.cell}:{where}" if self.cell is not None else where


@dataclass(frozen=True, order=True)
class TextEdit:
    """One replacement of a fix: the original text from (line, column) to (end_line, end_column), 1-based,
    columns in code points, the end exclusive, becomes ``content`` (tcaudit/rewrite/textedits.py)."""

    line: int
    column: int
    end_line: int
    end_column: int
    content: str
    # In a notebook: the code cell whose lines the rows count (a finding's edits in a notebook lie in
    # one cell each); None in a script.
    cell: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """ruff's JSON shape: ``content``, ``location`` and ``end_location`` as ``row``/``column``."""
        data: dict[str, Any] = {
            "content": self.content,
            "location": {"row": self.line, "column": self.column},
            "end_location": {"row": self.end_line, "column": self.end_column},
        }
        if self.cell is not None:
            data["cell"] = self.cell
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "TextEdit":
        start, end = data["location"], data["end_location"]
        cell = data.get("cell")
        return cls(int(start["row"]), int(start["column"]), int(end["row"]), int(end["column"]), str(data["content"]),
                   int(cell) if cell is not None else None)


class FixPlan:
    """What a finding's fix will edit, decided when the finding is made.

    Each rule with a fix subclasses it as a frozen dataclass holding the syntax nodes its detection
    found (so the fix edits exactly those and never looks its target up again) and the code it
    will write. :meth:`to_dict` renders the plan for JSON, SARIF and the cache: plain values as they
    are, syntax nodes left out (they belong to one parse of the file). Two plans are equal when
    they render equal, so a finding read back from the cache equals the one that was stored.
    """

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"kind": getattr(self, "kind", type(self).__name__)}
        for f in dataclasses.fields(self) if dataclasses.is_dataclass(self) else ():
            if f.name == "kind":
                continue
            raw = getattr(self, f.name)
            if "cst." in str(f.type) and (raw is None or isinstance(raw, (tuple, list))):
                continue  # an optional syntax node, or a sequence of them: left out whether or not there
            value = _plain(raw)
            if value is not _NOT_PLAIN:
                data[f.name] = value
        return data

    def creates(self) -> "tuple[Situation, ...]":
        """The situations this edit brings about that a decline elsewhere may protect against
        (:class:`Situation`); none by default."""
        return ()

    def put_under_autocast(self) -> tuple:
        """The statements (syntax nodes of the analysed text) this edit puts under autocast; none by
        default. Rules that run after the autocast fix read it (TC208: a BCE loss it would wrap)."""
        return ()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, FixPlan) and self.to_dict() == other.to_dict()

    def __hash__(self) -> int:
        return hash(repr(sorted(self.to_dict().items())))


_NOT_PLAIN = object()


def _plain(value: Any) -> Any:
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (list, tuple)):
        items = [_plain(v) for v in value]
        return _NOT_PLAIN if any(i is _NOT_PLAIN for i in items) else items
    if isinstance(value, dict):
        items = {str(k): _plain(v) for k, v in value.items()}
        return _NOT_PLAIN if any(i is _NOT_PLAIN for i in items.values()) else items
    return _NOT_PLAIN


class SituationKind(str, enum.Enum):
    """A state of the script that some fix's edit would bring about and that is known to break or
    mis-train it. A declined fix names the one it protects against; the fix engine then refuses every
    other edit that would bring it about (see :mod:`tcaudit.rules.situations`)."""

    RUNS_UNDER_AUTOCAST = "runs-under-autocast"  # subject: a function that cannot run under autocast
    FUSED_SGD_UNDER_GRADSCALER = "fused-sgd-under-gradscaler"  # subject: "" (the file)

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Situation:
    kind: SituationKind
    subject: str = ""  # the name it concerns (a helper function); "" for the whole file

    def describe(self) -> str:
        if self.kind is SituationKind.RUNS_UNDER_AUTOCAST:
            return f"`{self.subject}` running under autocast"
        return "fused SGD under a GradScaler"


class DeclineFix(Exception):
    """Raised where a fix cannot be made safely; the message is the reason shown to the user.

    Rules raise it while planning a fix at detection time (the finding then says ``no fix: reason``);
    an edit helper may still raise it while applying, which the fix engine reports the same way.
    ``protects`` names the situations the decline keeps the script out of: the fix engine refuses
    any other rule's edit that would bring one about."""

    def __init__(self, reason: str, *, protects: "tuple[Situation, ...]" = ()) -> None:
        super().__init__(reason)
        self.protects = tuple(protects)


@dataclass(frozen=True, eq=False)
class FollowsFix(FixPlan):
    """A fix that becomes possible once another rule's fix has been made (``TC504``'s set_epoch after
    ``TC503`` adds the DistributedSampler). Scan reports it as available, worded for the script as it
    stands; the fix engine makes the enabling fix first, and this rule's own fix in the next round,
    with a plan made from the text as it then is."""

    after: str  # the rule whose fix enables this one

    kind = "after-fix"


class RenderedPlan(FixPlan):
    """A plan read back from its rendering (the cache): it describes the edit, it cannot make it."""

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = dict(data)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.data)


class PendingEdits:
    """A fix's text edits not made yet: ``make()`` makes them (a tuple of :class:`TextEdit`, or None where
    they cannot be made alone) the first time ``Fix.edits`` is read, and the fix keeps what it returned.
    ``scan``'s default for the Python API and the editor (tcaudit/planned_edits.py): an edit costs a
    codemod run, and most findings' edits are never asked for."""

    __slots__ = ("make",)

    def __init__(self, make: "Callable[[], tuple[TextEdit, ...] | None]") -> None:
        self.make = make

    def then(self, step: "Callable[[tuple[TextEdit, ...]], tuple[TextEdit, ...] | None]") -> "PendingEdits":
        """Edits made by ``step`` from these once they are made (a notebook moves them into their cells)."""
        make = self.make

        def made() -> "tuple[TextEdit, ...] | None":
            edits = make()
            return None if edits is None else step(edits)

        return PendingEdits(made)


class _EditsField:
    """``Fix.edits``: a tuple, None, or a :class:`PendingEdits` made on first read. A failure to make them
    leaves the fix without edits (None), as an eager scan would."""

    def __get__(self, fix: "Fix | None", owner: type | None = None) -> "tuple[TextEdit, ...] | None":
        if fix is None:
            return None  # the dataclass field's default
        value = fix.__dict__.get("_edits")
        if isinstance(value, PendingEdits):
            try:
                made = value.make()
            except Exception:  # noqa: BLE001 - a fix whose edits cannot be made keeps none
                made = None
            value = None if made is None else tuple(made)
            fix.__dict__["_edits"] = value
        return value

    def __set__(self, fix: "Fix", value: "tuple[TextEdit, ...] | PendingEdits | None") -> None:
        # The dataclass hands this field object itself to ``__init__`` as the default.
        fix.__dict__["_edits"] = None if isinstance(value, _EditsField) else value


@dataclass(frozen=True)
class Fix:
    """Whether and how a finding would be fixed.

    ``available`` is False when the fix is declined; ``reason`` then says why, and ``tcaudit fix``
    will not edit this finding. When available, ``plan`` is exactly what the fix will do.
    """

    fix_class: FixClass
    description: str
    available: bool = True
    reason: str | None = None
    plan: FixPlan | None = None
    # A fix that runs only when asked for by name: a structural conversion (``ddp``, ``dali``,
    # ``compile``: ``tcaudit fix --ddp``, or ``structural-fixes = ["ddp"]`` in the config), or a
    # numerics fix that changes the model's shape (``pad-dims``: ``tcaudit fix --pad-dims``).
    option: str | None = None
    # What a declined fix protects against (another rule's edit that brings it about is refused), and
    # what an available fix's edit brings about. Neither is part of the rendered fix: they matter only
    # while one version of the file is analysed or fixed.
    protects: tuple["Situation", ...] = field(default=(), compare=False)
    creates: tuple["Situation", ...] = field(default=(), compare=False)
    # The change this fix makes, as replacements of the analysed text (an available fix's, where scan
    # computed it): applied alone to that text they give a file that parses. A fix that needs another
    # rule's fix first (the rule's ``after``) carries that fix's edits too. None: not computed. A
    # ``PendingEdits`` given here is made the first time ``edits`` is read (``edits_pending`` till then).
    edits: "tuple[TextEdit, ...] | None" = field(default=_EditsField(), compare=False)  # type: ignore[assignment]

    @property
    def edits_pending(self) -> bool:
        """Whether the edits are still to be made (reading ``edits`` makes them)."""
        return isinstance(self.__dict__.get("_edits"), PendingEdits)

    @property
    def pending_edits(self) -> "PendingEdits | None":
        """The edits still to be made, without making them (None where they are made or there are none)."""
        value = self.__dict__.get("_edits")
        return value if isinstance(value, PendingEdits) else None

    def __getstate__(self) -> dict[str, Any]:
        """Pickled (the cache, scan's worker processes) with its edits made: the maker holds the analysis."""
        state = dict(self.__dict__)
        if isinstance(state.get("_edits"), PendingEdits):
            state["_edits"] = self.edits
        return state

    @property
    def applies_by_default(self) -> bool:
        """Whether plain ``tcaudit fix`` applies it: available, and neither structural nor an opt-in."""
        return self.available and self.fix_class is not FixClass.STRUCTURAL and self.option is None

    def enabled(self, classes: "frozenset[FixClass]", options: "frozenset[str] | tuple[str, ...]") -> bool:
        """Whether a fix run with these classes and options (``Settings.fix_options``) applies this fix."""
        if self.option is not None and self.option not in options:
            return False
        if self.fix_class is FixClass.STRUCTURAL:
            return self.option is not None
        return self.fix_class in classes

    def __repr__(self) -> str:
        """Short: the class, what it does, whether it is made and why not (never the plan's syntax trees,
        which ran to hundreds of thousands of characters), and how many text edits it carries."""
        parts = [f"{self.fix_class.value!r}", repr(self.description)]
        if not self.available:
            parts.append(f"available=False, reason={self.reason!r}")
        if self.option is not None:
            parts.append(f"option={self.option!r}")
        if self.plan is not None:
            parts.append(f"plan={type(self.plan).__name__}")
        if self.edits_pending:
            parts.append("edits=pending")
        elif self.edits is not None:
            parts.append(f"edits={len(self.edits)}")
        return f"Fix({', '.join(parts)})"

    def declined(self, reason: str) -> "Fix":
        """The same fix, declined with ``reason``."""
        return dataclasses.replace(self, available=False, reason=reason, plan=None, creates=(), edits=None)

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "class": str(self.fix_class),
            "description": self.description,
            "available": self.available,
        }
        if self.reason:
            data["reason"] = self.reason
        if self.option:
            data["option"] = self.option
        if self.plan is not None:
            data["edit"] = self.plan.to_dict()
        if self.available:
            data["applicability"] = str(self.fix_class)
        if self.edits is not None:
            data["edits"] = [edit.to_dict() for edit in self.edits]
        return data


@dataclass(frozen=True)
class Related:
    """Another place a finding concerns: the helper in another module whose sync a per-step call runs,
    the DataLoader a factory builds. ``mirror``: the finding is also reported at this place when its
    file is scanned (with the same rule, from the caller's point of view); shown in the text report,
    JSON ``related``, SARIF ``relatedLocations`` and LSP ``relatedInformation``."""

    location: Location
    message: str
    mirror: bool = False

    def to_dict(self) -> dict[str, Any]:
        loc = self.location
        return {
            "path": loc.path,
            **({"cell": loc.cell} if loc.cell is not None else {}),
            "line": loc.line,
            "column": loc.column,
            "end_line": loc.end_line,
            "end_column": loc.end_column,
            "message": self.message,
        }


# The ``Finding.details`` key that says the finding's advice cannot pay in this script (``"launch-bound"``:
# the model audit measured the trained model as launch-bound; ``"rl-loop"``): the reports then neither
# rank it by nor quote the rule's measured speed-up (tcaudit/report/order.py).
LITTLE_TO_GAIN = "little_to_gain"


def mirrored_at(finding: "Finding", location: Location, message: str, source_line: str) -> "Finding":
    """``finding`` (reported at a call in a training loop) again at ``location``, the place in another
    module it concerns (a related place marked ``mirror``), from that place's point of view: its own
    message, the caller's fix as at most a reason (it edits the caller's file), the call as related."""
    fix = finding.fix
    return Finding(
        rule=finding.rule,
        name=finding.name,
        severity=finding.severity,
        location=location,
        message=message,
        fix=fix.declined(fix.reason or "") if fix is not None else None,
        source_line=source_line,
        explanation=finding.explanation,
        related=(Related(finding.location, "the call in the training loop"),),
    )


@dataclass
class Finding:
    rule: str
    name: str
    severity: Severity
    location: Location
    message: str
    fix: Fix | None = None
    # Model findings carry module path, shapes, FLOP share and estimated time lost here.
    details: dict[str, Any] = field(default_factory=dict)
    # Text of the first flagged line and the enclosing def, used for baseline fingerprints.
    source_line: str = ""
    scope: str = ""
    fingerprint: str = ""
    # The rule whose fix, not made yet, this finding presumes (TC303's channels_last for the autocast
    # TC201's fix adds); by default the rule its fix waits for (``waits_for``). Such a finding is
    # reported right after its leader's (tcaudit/report/order.py) and is never an error: the script
    # as it stands does not have the problem, so ``--fail-on error`` must not fail on it.
    follows: str | None = None
    # The long form, where the message (what and where, at most 120 characters) leaves something out:
    # why it matters, the measured figures for the target GPU and what the fix does. Shown by
    # ``scan --show-fixes``, in JSON as ``explanation``, in SARIF as the message's markdown.
    explanation: str = ""
    # Other places this finding concerns (a helper's line in another module): see :class:`Related`.
    related: tuple[Related, ...] = ()

    def __post_init__(self) -> None:
        if self.follows is None:
            self.follows = self.waits_for
        if self.follows is not None and self.severity > Severity.WARNING:
            self.severity = Severity.WARNING

    @property
    def waits_for(self) -> str | None:
        """The rule whose fix this finding's fix is made after (its plan's ``after``: a
        :class:`FollowsFix`, TC404's persistent_workers after TC401's workers), or None."""
        plan = self.fix.plan if self.fix is not None else None
        after = getattr(plan, "after", None)
        return after if isinstance(after, str) and after != self.rule else None

    @property
    def sort_key(self) -> tuple:
        loc = self.location
        return (loc.path, loc.cell or 0, loc.line, loc.column, self.rule, self.message)

    def to_dict(self) -> dict[str, Any]:
        loc = self.location
        data: dict[str, Any] = {
            "rule": self.rule,
            "name": self.name,
            "severity": str(self.severity),
            "path": loc.path,
            **({"cell": loc.cell} if loc.cell is not None else {}),
            "line": loc.line,
            "column": loc.column,
            "end_line": loc.end_line,
            "end_column": loc.end_column,
            "message": self.message,
            "fix": self.fix.to_dict() if self.fix else None,
            "fingerprint": self.fingerprint,
        }
        if self.details:
            data["details"] = self.details
        if self.follows:
            data["follows"] = self.follows
        if self.explanation:
            data["explanation"] = self.explanation
        if self.related:
            data["related"] = [related.to_dict() for related in self.related]
        return data


def _path_key(path: str, root: "Path | None") -> str:
    """The path as seen from the project root, so a baseline works from any working directory."""
    if root is None:
        return path
    try:
        return Path(path).resolve().relative_to(root.resolve()).as_posix()
    except (ValueError, OSError, RuntimeError):  # RuntimeError: a symlink loop (Python < 3.13)
        return path


def assign_fingerprints(findings: list[Finding], root: "Path | None" = None) -> None:
    """Give each finding a fingerprint that survives unrelated line shifts.

    The fingerprint hashes the rule, the file, the enclosing scope and the flagged line's text
    (whitespace-normalised), plus the occurrence index among findings sharing those, so that an
    edit above a finding does not change it, while a second identical finding stays distinct.
    """
    seen: dict[str, int] = {}
    keys: dict[str, str] = {}  # each file's path key, resolved once
    for finding in sorted(findings, key=lambda f: f.sort_key):
        text = " ".join(finding.source_line.split())
        path = finding.location.path
        if path not in keys:
            keys[path] = _path_key(path, root)
        base = "\x1f".join((finding.rule, keys[path], finding.scope, text))
        index = seen.get(base, 0)
        seen[base] = index + 1
        digest = hashlib.sha256(f"{base}\x1f{index}".encode("utf-8")).hexdigest()
        finding.fingerprint = digest[:20]
