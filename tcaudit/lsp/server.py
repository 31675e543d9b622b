"""``tcaudit server``: tcaudit as a language server (the Language Server Protocol over stdio, on pygls).

What it does for each Python document the editor opens:

* **Diagnostics at typing speed.** On open and on every change the script rules scan the editor's
  text, from memory (:func:`tcaudit.api.scan` with a text), in a worker thread: the editor never
  waits, and a scan that a newer change overtakes is followed at once by one of the newest text.
  Each document has its own scans (a pool of threads serves them side by side), so a huge document
  never holds up the answers about another.
* **A text that does not parse** gets its TC000 (which line, and what is wrong there) and keeps the
  last good diagnostics of every other place, moved to where their lines are now (``data.stale``).
* **The model audit on save.** On save (where the settings let scan build models: ``exec-models``
  and a TC1 rule enabled) the models the saved file builds are audited in the background (one audit
  at a time: the sandbox builds one model at a time; scans never wait for it), from and into the
  scan cache ``tcaudit scan`` keeps, so an unchanged model costs a cache read. A newer save of the
  document supersedes its audit still running: that result is dropped (the sandbox's model build is
  not interrupted) and the newest save is audited next. Its findings join the diagnostics, and the
  script rules decide with what it measured, until the next save.
* **Quick fixes.** Every finding whose fix is available gets a code action with the fix's own
  edits ("Apply numerics fix: ..."), made when the editor asks, for that finding alone, from the
  document's last analysis (no second scan); "Fix all safe" (``source.fixAll.tcaudit``) makes
  ``tcaudit fix --classes safe`` on the whole text, when the client resolves the action
  (``codeAction/resolve``) or asks for that kind by name; "Suppress TCxxx on this line" adds the
  rule's code to a ``# noqa:`` comment.

**Notebooks** (the protocol's notebook document sync, ``notebookDocument/did*``, which VS Code's
language client sends for Jupyter notebooks): the cells are put together as the notebook file they
stand for and scanned exactly as ``tcaudit scan train.ipynb`` scans it (tcaudit/source/notebook.py:
the same virtual script, the same IPython masking, the same cell numbers); each code cell gets its own
diagnostics, and a quick fix edits the cells its edits lie in. The model audit does not run for them.

Settings come from the same config files the command line reads (the nearest ``pyproject.toml``,
``tcaudit.toml`` or ``.tcaudit.toml`` upward from the document), with the client's
``initializationOptions.settings`` (config keys) on top; a saved config file is read again.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from lsprotocol import types as lsp
from pygls.lsp.server import LanguageServer
from pygls.uris import to_fs_path

from tcaudit import __version__, api
from tcaudit.config import CONFIG_NAMES, ConfigError, Settings, load_settings
from tcaudit.findings import Finding
from tcaudit.lsp import convert
from tcaudit.model.sandbox import Cancelled

log = logging.getLogger(__name__)


# Threads that scan documents and make fixes' edits: one document's scans run one at a time, so this
# many documents are analysed side by side (they share the interpreter, which switches between them).
SCAN_THREADS = 4
# Model audits running at once: one, since every audit of this process talks to one sandbox process
# (tcaudit/model/sandbox.py's ``shared_sandbox``), one model at a time. Scans never wait for it.
AUDIT_THREADS = 1


class IdleCollector:
    """When Python's cycle collector runs: not while a document is analysed or its diagnostics sent, but
    in full once the server has been idle for ``idle_s`` (a pause in the typing), and on the young
    generations only (what the last analyses left: a few ms) after ``most`` analyses with no pause.
    Each analysis leaves cycles (facts and the layers made of them); collected after each publish, they
    cost about 10 ms, which back-to-back edits paid on the next keystroke (on a 2,000-line file, CPU)."""

    def __init__(self, idle_s: float = 0.25, most: int = 8) -> None:
        self.idle_s = idle_s
        self.most = most
        self._lock = threading.Lock()
        self._busy = 0
        self._since = 0  # analyses since the last collection
        self._turn = 0  # counts the pauses, so a timer knows whether one came after it was set

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        with self._lock:
            self._busy += 1
            gc.disable()
        try:
            yield
        finally:
            with self._lock:
                self._busy -= 1
                self._since += 1
                self._turn += 1
                turn, due = self._turn, not self._busy and self._since >= self.most
            if due:  # what the last few analyses left: the young generations only, a few ms
                self.collect(turn, 1)
            else:
                with contextlib.suppress(RuntimeError):  # no event loop (a direct call): at the next pause
                    asyncio.get_running_loop().call_later(self.idle_s, self.collect, turn)

    def collect(self, turn: int, generation: int = 2) -> None:
        """Collect now (``generation``: the youngest generations up to it), where nothing was analysed since
        pause number ``turn`` and nothing is."""
        with self._lock:
            if self._busy or turn != self._turn:
                return
            self._since = 0
        gc.enable()
        gc.collect(generation)


@dataclass
class Analysis:
    """One scan of one version of a document's text: its findings, whose fixes' edits are made on demand."""

    version: int | None
    text: str
    findings: list[Finding]

    @property
    def parsed(self) -> bool:
        return not any(f.rule == "TC000" for f in self.findings)


@dataclass
class Document:
    """What the server keeps about one open document."""

    uri: str
    path: Path | None
    display: str
    scanning: bool = False  # a scan of this document is running
    stale: bool = False  # the text changed while it ran: scan again when it ends
    closed: bool = False
    # The last model audit of the saved file: what the script rules decide with, and its findings.
    models: Any = None
    model_findings: list[Finding] = field(default_factory=list)
    # The last scan published, and the last one of a text that parsed (what a broken text keeps).
    analysis: Analysis | None = None
    good: Analysis | None = None
    # The model audit: running (a task), and whether a save came while it ran (audit again after it).
    audit: "asyncio.Task | None" = None
    audit_again: bool = False
    # A notebook (notebookDocument sync): its cells are text documents of their own; the cell URIs
    # whose diagnostics were last published (a cell that lost its findings, or went, is cleared).
    notebook: bool = False
    cells_published: set[str] = field(default_factory=set)
    # The last parse and the walks over it, for the next scan (tcaudit/source/incremental.py).
    incremental: api.IncrementalState = field(default_factory=api.IncrementalState)


class TcauditServer(LanguageServer):
    def __init__(self) -> None:
        super().__init__(
            "tcaudit", __version__, text_document_sync_kind=lsp.TextDocumentSyncKind.Incremental,
            notebook_document_sync=lsp.NotebookDocumentSyncOptions(notebook_selector=[
                lsp.NotebookDocumentFilterWithCells(notebook="jupyter-notebook",
                                                    cells=[lsp.NotebookCellLanguage(language="python")]),
            ]),
        )
        self.documents: dict[str, Document] = {}
        self.options: dict[str, Any] = {}  # initializationOptions.settings: config keys
        self.model_audit = True  # initializationOptions.modelAudit
        self._settings: dict[str, Settings] = {}  # by the folder the config is looked for from
        self.scans = ThreadPoolExecutor(max_workers=SCAN_THREADS, thread_name_prefix="tcaudit-scan")
        self.audits = ThreadPoolExecutor(max_workers=AUDIT_THREADS, thread_name_prefix="tcaudit-audit")
        self.auditing: str | None = None  # the document whose model audit runs now
        self.collector = IdleCollector()

    # -- settings ---------------------------------------------------------------------------------
    def settings_for(self, document: Document) -> Settings:
        folder = str(document.path.parent) if document.path is not None else os.getcwd()
        settings = self._settings.get(folder)
        if settings is None:
            start = [str(document.path)] if document.path is not None else []
            overrides = {key.replace("_", "-"): value for key, value in self.options.items()}
            try:
                settings = load_settings(start, None, overrides)
            except ConfigError as exc:
                self.window_show_message(lsp.ShowMessageParams(type=lsp.MessageType.Error, message=f"tcaudit: {exc}"))
                settings = load_settings(start, None, None, isolated=True)
            settings = api.with_detected_gpu(settings)  # detected once per process (tcaudit.gpus.detected)
            # The quick fixes are what ``tcaudit fix`` makes with these settings: a structural conversion
            # (``fix --ddp``, ``--compile``...) only where the config asks for it (``structural-fixes``);
            # the others are not planned (the DDP and compile plans were a quarter of an edit's analysis).
            settings = dataclasses.replace(settings, plan_unasked=False)
            self._settings[folder] = settings
        return settings

    def forget_settings(self) -> None:
        self._settings.clear()

    # -- documents ---------------------------------------------------------------------------------
    def document(self, uri: str) -> Document:
        found = self.documents.get(uri)
        if found is None:
            path = Path(to_fs_path(uri)) if uri.startswith("file:") else None
            if path is not None:
                from tcaudit.source.discovery import display_path

                display = display_path(path)
            else:
                display = uri.rsplit("/", 1)[-1] or api.TEXT_NAME
            found = self.documents[uri] = Document(uri, path, display)
        return found

    def schedule_scan(self, uri: str) -> None:
        """Scan the document's newest text soon; a scan running now is followed by one more."""
        document = self.document(uri)
        if document.scanning:
            document.stale = True
            return
        document.scanning = True
        asyncio.get_running_loop().create_task(self._scan_loop(document))

    async def _scan_loop(self, document: Document) -> None:
        try:
            while True:
                document.stale = False
                text, version = self.current_text(document)
                # Python's cycle collector waits while the document is analysed and its diagnostics
                # are sent, and until the typing pauses (IdleCollector).
                with self.collector.paused():
                    analysis = await self._analyse(document, text, version)
                    if document.closed:
                        return
                    if not document.stale:
                        if document.notebook:
                            self.publish_cells(document, analysis)
                        else:
                            self.publish(document, self.workspace.get_text_document(document.uri), analysis)
                        return
        finally:
            document.scanning = False

    def current_text(self, document: Document) -> tuple[str, int | None]:
        """(the document's text now, its version); a notebook's text is the notebook file its cells make."""
        if not document.notebook:
            text_document = self.workspace.get_text_document(document.uri)
            return text_document.source, text_document.version
        notebook = self.workspace.get_notebook_document(notebook_uri=document.uri)
        if notebook is None:
            return convert.notebook_json([]), None
        cells = [(cell.kind == lsp.NotebookCellKind.Code, self.workspace.get_text_document(cell.document).source)
                 for cell in notebook.cells]
        return convert.notebook_json(cells), notebook.version

    def cell_uris(self, document: Document) -> list[str]:
        """The notebook's cell document URIs, in order: cell ``n`` of a finding is ``cell_uris()[n - 1]``."""
        notebook = self.workspace.get_notebook_document(notebook_uri=document.uri)
        return [cell.document for cell in notebook.cells] if notebook is not None else []

    def publish_cells(self, document: Document, analysis: Analysis) -> None:
        """A notebook's findings as each code cell's diagnostics, in the cell's own lines."""
        document.analysis = analysis
        uris = self.cell_uris(document)
        by_cell: dict[str, list[Finding]] = {}
        for finding in analysis.findings:
            cell = finding.location.cell
            uri = uris[cell - 1] if cell is not None and 0 < cell <= len(uris) else (uris[0] if uris else None)
            if uri is not None:
                by_cell.setdefault(uri, []).append(finding)
        for uri in sorted(set(by_cell) | (document.cells_published & set(uris))):
            cell_document = self.workspace.get_text_document(uri)
            lines, codec = cell_document.lines, cell_document.position_codec
            findings = by_cell.get(uri, [])
            self.text_document_publish_diagnostics(lsp.PublishDiagnosticsParams(
                uri=uri, version=cell_document.version,
                diagnostics=[convert.diagnostic(f, lines, codec, uri, findings) for f in findings]))
        document.cells_published = set(by_cell)

    async def _analyse(self, document: Document, text: str, version: int | None) -> Analysis:
        """A scan of ``text`` (in a worker thread), its fixes' edits left to be made on demand."""
        loop = asyncio.get_running_loop()
        settings = self.settings_for(document)
        try:
            findings = await loop.run_in_executor(self.scans, self._scan, document, settings, text, "lazy")
        except Exception as exc:  # noqa: BLE001 - a bug must not end the server
            self.log(lsp.MessageType.Error, f"tcaudit: internal error while scanning {document.display}: {exc!r}")
            findings = api.Findings.empty()
        for error in findings.errors:
            self.log(lsp.MessageType.Error, f"tcaudit: {error.splitlines()[0]}")
        return Analysis(version, text, list(findings))

    async def analysis_of(self, document: Document, text: str, version: int | None) -> Analysis:
        """The analysis of the document's text as it is: the last one published where it was of this
        text (a code action right after the diagnostics costs no scan), else a scan now."""
        last = document.analysis
        if last is not None and last.version == version and last.text == text:
            return last
        return await self._analyse(document, text, version)

    def _scan(self, document: Document, settings: Settings, text: str, edits) -> api.Findings:
        """The document's findings (in a worker thread: nothing here talks to the client); ``edits``:
        ``"lazy"`` (made when first read), or False."""
        return api.scan(text=text, filename=document.display, settings=settings, edits=edits,
                        models=document.models, model_findings=document.model_findings,
                        incremental=document.incremental)

    def publish(self, document: Document, text_document, analysis: Analysis) -> None:
        document.analysis = analysis
        lines, codec = text_document.lines, text_document.position_codec
        findings = analysis.findings
        diagnostics = [convert.diagnostic(f, lines, codec, document.uri, findings) for f in findings]
        if analysis.parsed:
            document.good = analysis
        elif document.good is not None:
            broken = [f for f in findings if f.rule == "TC000"]
            for diagnostic, finding in zip(diagnostics, findings):
                if finding.rule == "TC000":
                    diagnostic.message = convert.broken_text_message(finding, analysis.text)
            kept = convert.carried_over(document.good.findings, document.good.text, analysis.text,
                                        {f.location.line for f in broken})
            for finding in kept:
                diagnostic = convert.diagnostic(finding, lines, codec, document.uri, kept)
                diagnostic.data = {**(diagnostic.data or {}), "stale": True}
                diagnostics.append(diagnostic)
        self.text_document_publish_diagnostics(lsp.PublishDiagnosticsParams(
            uri=document.uri, version=analysis.version, diagnostics=diagnostics))

    def log(self, kind: lsp.MessageType, message: str) -> None:
        self.window_log_message(lsp.LogMessageParams(type=kind, message=message))

    # -- the model audit ----------------------------------------------------------------------------
    def schedule_audit(self, uri: str) -> None:
        """Audit the saved file's models in the background; a save while an audit of this document runs
        supersedes it (its result is dropped, and the newest save is audited when it ends)."""
        document = self.document(uri)
        if document.path is None or not self.model_audit:
            return
        settings = self.settings_for(document)
        from tcaudit.engine import model_audit_wanted

        if not model_audit_wanted(settings):
            return
        if document.audit is not None and not document.audit.done():
            document.audit_again = True
            if self.auditing == uri:  # what it is building is already old: end it now
                from tcaudit.model.sandbox import shared_sandbox

                shared_sandbox().cancel()
            return
        document.audit = asyncio.get_running_loop().create_task(self._audit(document))

    async def _audit(self, document: Document) -> None:
        loop = asyncio.get_running_loop()
        while True:
            document.audit_again = False
            settings = self.settings_for(document)
            try:
                models, findings, notes = await loop.run_in_executor(self.audits, self._audit_file, document, settings)
            except Cancelled:  # a newer save (or, rarely, another document's) ended it: audit the file as it is now
                if document.closed:
                    return
                self.log(lsp.MessageType.Info,
                         f"tcaudit: model audit of {document.display} cancelled: a newer save came")
                continue
            except Exception as exc:  # noqa: BLE001
                self.log(lsp.MessageType.Error,
                         f"tcaudit: internal error in the model audit of {document.display}: {exc!r}")
                return
            if document.closed:
                return
            if document.audit_again:  # a newer save came: what this audit saw is already old
                continue
            for note in notes:
                self.log(lsp.MessageType.Info, f"tcaudit: {note}")
            document.models, document.model_findings = models, findings
            document.analysis = None
            self.schedule_scan(document.uri)
            return

    def _audit_file(self, document: Document, settings: Settings):
        """:func:`_audit_file` in the audit thread, noting which document it audits (a save of that
        document while it runs cancels it)."""
        from tcaudit.model.sandbox import shared_sandbox

        shared_sandbox().resume()
        self.auditing = document.uri
        try:
            return _audit_file(document, settings)
        finally:
            self.auditing = None

    # -- code actions ------------------------------------------------------------------------------
    async def cell_code_actions(self, document: Document, params: lsp.CodeActionParams) -> list[lsp.CodeAction]:
        """A notebook cell's quick fixes: a fix's edits, each in the cell it lies in (versioned by that
        cell's version), and the suppression comment on the finding's line of this cell."""
        uri = params.text_document.uri
        uris = self.cell_uris(document)
        if uri not in uris:
            return []
        number = uris.index(uri) + 1
        text, version = self.current_text(document)
        findings = (await self.analysis_of(document, text, version)).findings
        cell_document = self.workspace.get_text_document(uri)
        lines, codec = cell_document.lines, cell_document.position_codec
        near = [f for f in findings if f.location.cell == number
                and _overlaps(convert.finding_range(f, lines, codec), params.range)]
        wanted = params.context.only
        if not _wants(wanted, lsp.CodeActionKind.QuickFix):
            return []
        await asyncio.get_running_loop().run_in_executor(self.scans, _make_edits, near)
        capabilities = self.client_capabilities.workspace
        versioned = bool(capabilities and capabilities.workspace_edit and capabilities.workspace_edit.document_changes)
        actions: list[lsp.CodeAction] = []
        for finding in near:
            diag = convert.diagnostic(finding, lines, codec, uri, near)
            fix = finding.fix
            edits = fix.edits if fix is not None and fix.available else None
            if edits and all(e.cell is not None and 0 < e.cell <= len(uris) for e in edits):
                changes = []
                for cell in sorted({e.cell for e in edits}):
                    target = self.workspace.get_text_document(uris[cell - 1])
                    changes.append((target.uri, target.version, convert.text_edits(
                        [e for e in edits if e.cell == cell], target.lines, target.position_codec)))
                actions.append(lsp.CodeAction(
                    title=convert.fix_title(finding), kind=lsp.CodeActionKind.QuickFix, diagnostics=[diag],
                    is_preferred=fix.applies_by_default, edit=convert.workspace_edits(changes, versioned)))
            suppress = convert.suppression_edit(cell_document.source, finding.location.line, finding.rule)
            if suppress is not None:
                actions.append(lsp.CodeAction(
                    title=f"Suppress {finding.rule} on this line", kind=lsp.CodeActionKind.QuickFix,
                    diagnostics=[diag], edit=convert.workspace_edit(
                        uri, cell_document.version, convert.text_edits([suppress], lines, codec), versioned)))
        return actions

    async def code_actions(self, params: lsp.CodeActionParams) -> list[lsp.CodeAction]:
        document = self.document(params.text_document.uri)
        text_document = self.workspace.get_text_document(document.uri)
        text, version = text_document.source, text_document.version
        lines, codec = text_document.lines, text_document.position_codec
        loop = asyncio.get_running_loop()
        findings = (await self.analysis_of(document, text, version)).findings
        asked = params.range
        near = [f for f in findings if _overlaps(convert.finding_range(f, lines, codec), asked)]
        wanted = params.context.only
        # The fixes' edits of the findings asked about, each made now for that finding alone.
        if _wants(wanted, lsp.CodeActionKind.QuickFix):
            await loop.run_in_executor(self.scans, _make_edits, near)
        capabilities = self.client_capabilities.workspace
        versioned = bool(capabilities and capabilities.workspace_edit and capabilities.workspace_edit.document_changes)
        actions: list[lsp.CodeAction] = []
        for finding in near:
            diag = convert.diagnostic(finding, lines, codec, document.uri, findings)
            fix = finding.fix
            if _wants(wanted, lsp.CodeActionKind.QuickFix):
                if fix is not None and fix.available and fix.edits:
                    actions.append(lsp.CodeAction(
                        title=convert.fix_title(finding),
                        kind=lsp.CodeActionKind.QuickFix,
                        diagnostics=[diag],
                        is_preferred=fix.applies_by_default,
                        edit=convert.workspace_edit(document.uri, version, convert.text_edits(fix.edits, lines, codec),
                                                    versioned),
                    ))
                suppress = convert.suppression_edit(text, finding.location.line, finding.rule)
                if suppress is not None:
                    actions.append(lsp.CodeAction(
                        title=f"Suppress {finding.rule} on this line",
                        kind=lsp.CodeActionKind.QuickFix,
                        diagnostics=[diag],
                        edit=convert.workspace_edit(document.uri, version, convert.text_edits([suppress], lines, codec),
                                                    versioned),
                    ))
        fix_all = [f for f in findings if f.fix is not None and f.fix.available and f.fix.fix_class.value == "safe"]
        if fix_all and _wants(wanted, convert.FIX_ALL_KIND):
            title = f"Fix all safe tcaudit findings ({', '.join(sorted({f.rule for f in fix_all}))})"
            if self.resolves_edits() and not _names(wanted, convert.FIX_ALL_KIND):
                # Made when the client resolves the action (one ``tcaudit fix`` of the whole text),
                # not each time it lists the actions.
                actions.append(lsp.CodeAction(title=title, kind=convert.FIX_ALL_KIND,
                                              data={"uri": document.uri, "version": version}))
            elif _names(wanted, convert.FIX_ALL_KIND):  # made now: titled by what it did
                action = await self.fix_all_action(document)
                if action is not None:
                    actions.append(action)
        return actions

    def resolves_edits(self) -> bool:
        """Whether the client resolves a code action's edit (``codeAction/resolve``)."""
        text = self.client_capabilities.text_document
        action = text.code_action if text is not None else None
        support = action.resolve_support if action is not None else None
        return bool(support and "edit" in support.properties)

    async def fix_all_action(self, document: Document, title: str | None = None) -> lsp.CodeAction | None:
        """"Fix all safe" with its edit: ``tcaudit fix --classes safe`` on the document's text now."""
        text_document = self.workspace.get_text_document(document.uri)
        text, version, lines = text_document.source, text_document.version, text_document.lines
        settings = self.settings_for(document)
        result = await asyncio.get_running_loop().run_in_executor(self.scans, _fix_all_safe, document, settings, text)
        if not result.changed:
            return None
        capabilities = self.client_capabilities.workspace
        versioned = bool(capabilities and capabilities.workspace_edit and capabilities.workspace_edit.document_changes)
        return lsp.CodeAction(
            title=title or f"Fix all safe tcaudit findings ({', '.join(result.applied)})",
            kind=convert.FIX_ALL_KIND,
            edit=convert.workspace_edit(document.uri, version,
                                        [convert.whole_text_edit(lines, result.text, text_document.position_codec)],
                                        versioned),
        )


def _make_edits(findings: list[Finding]) -> None:
    """Make the fixes' edits of ``findings`` (each reads ``fix.edits`` once: made then, kept after)."""
    for finding in findings:
        if finding.fix is not None and finding.fix.available:
            finding.fix.edits


def _audit_file(document: Document, settings: Settings):
    """(the AuditedModels of the saved file, the audit's findings for it, its notes), from and into
    the scan cache."""
    from tcaudit.cache import open_cache
    from tcaudit.engine import run_audit
    from tcaudit.model import audited_models

    assert document.path is not None
    cache = open_cache(settings)
    audit = run_audit([document.path], [document.display], settings, cache)
    if audit is None:
        return None, [], []
    models = audited_models(audit.facts).get(os.path.realpath(document.path))
    findings = [f for f in audit.findings if f.location.path == document.display]
    return models, findings, list(audit.notes) + [e.splitlines()[0] for e in audit.errors]


def _fix_all_safe(document: Document, settings: Settings, text: str):
    return api.fix(text, filename=document.display, settings=settings, classes="safe", models=document.models)


def _overlaps(a: lsp.Range, b: lsp.Range) -> bool:
    def key(p: lsp.Position) -> tuple[int, int]:
        return (p.line, p.character)

    return key(a.start) <= key(b.end) and key(b.start) <= key(a.end)


def _wants(only: "list[str] | None", kind: str) -> bool:
    """Whether the client's ``only`` filter admits ``kind`` (a kind admits its sub-kinds)."""
    return not only or _names(only, kind)


def _names(only: "list[str] | None", kind: str) -> bool:
    """Whether the client's ``only`` filter asks for ``kind`` by name (or one of the kinds above it)."""
    return bool(only) and any(kind == k or kind.startswith(f"{k}.") for k in only)


def build_server() -> TcauditServer:
    server = TcauditServer()

    @server.feature(lsp.INITIALIZE)
    def initialize(ls: TcauditServer, params: lsp.InitializeParams) -> None:
        options = params.initialization_options or {}
        if isinstance(options, dict):
            settings = options.get("settings") or {}
            if isinstance(settings, dict):
                ls.options = dict(settings)
            if options.get("modelAudit") is False:
                ls.model_audit = False

    @server.feature(lsp.TEXT_DOCUMENT_DID_OPEN)
    def did_open(ls: TcauditServer, params: lsp.DidOpenTextDocumentParams) -> None:
        if _is_python(params.text_document.uri, params.text_document.language_id):
            ls.document(params.text_document.uri).closed = False
            ls.schedule_scan(params.text_document.uri)

    @server.feature(lsp.TEXT_DOCUMENT_DID_CHANGE)
    def did_change(ls: TcauditServer, params: lsp.DidChangeTextDocumentParams) -> None:
        if params.text_document.uri in ls.documents:
            ls.schedule_scan(params.text_document.uri)

    @server.feature(lsp.TEXT_DOCUMENT_DID_SAVE, lsp.SaveOptions(include_text=False))
    def did_save(ls: TcauditServer, params: lsp.DidSaveTextDocumentParams) -> None:
        uri = params.text_document.uri
        if uri.rsplit("/", 1)[-1] in CONFIG_NAMES:
            ls.forget_settings()
            for open_uri in list(ls.documents):
                ls.schedule_scan(open_uri)
            return
        if uri in ls.documents:
            ls.schedule_audit(uri)

    @server.feature(lsp.NOTEBOOK_DOCUMENT_DID_OPEN)
    def notebook_did_open(ls: TcauditServer, params: lsp.DidOpenNotebookDocumentParams) -> None:
        document = ls.document(params.notebook_document.uri)
        document.notebook, document.closed = True, False
        if not document.display.lower().endswith(".ipynb"):  # scanned as a notebook by its name, as scan does
            document.display += ".ipynb"
        ls.schedule_scan(document.uri)

    @server.feature(lsp.NOTEBOOK_DOCUMENT_DID_CHANGE)
    def notebook_did_change(ls: TcauditServer, params: lsp.DidChangeNotebookDocumentParams) -> None:
        if params.notebook_document.uri in ls.documents:
            ls.schedule_scan(params.notebook_document.uri)

    @server.feature(lsp.NOTEBOOK_DOCUMENT_DID_CLOSE)
    def notebook_did_close(ls: TcauditServer, params: lsp.DidCloseNotebookDocumentParams) -> None:
        document = ls.documents.pop(params.notebook_document.uri, None)
        if document is not None:
            document.closed = True
            document.analysis = document.good = None
            for uri in sorted(document.cells_published):
                ls.text_document_publish_diagnostics(lsp.PublishDiagnosticsParams(uri=uri, diagnostics=[]))

    @server.feature(lsp.TEXT_DOCUMENT_DID_CLOSE)
    def did_close(ls: TcauditServer, params: lsp.DidCloseTextDocumentParams) -> None:
        document = ls.documents.pop(params.text_document.uri, None)
        if document is not None:
            document.closed = True
            document.analysis = document.good = None
            ls.text_document_publish_diagnostics(lsp.PublishDiagnosticsParams(uri=document.uri, diagnostics=[]))

    @server.feature(lsp.WORKSPACE_DID_CHANGE_WATCHED_FILES)
    def did_change_watched(ls: TcauditServer, params: lsp.DidChangeWatchedFilesParams) -> None:
        if any(change.uri.rsplit("/", 1)[-1] in CONFIG_NAMES for change in params.changes):
            ls.forget_settings()
            for open_uri in list(ls.documents):
                ls.schedule_scan(open_uri)

    @server.feature(
        lsp.TEXT_DOCUMENT_CODE_ACTION,
        lsp.CodeActionOptions(code_action_kinds=[lsp.CodeActionKind.QuickFix, convert.FIX_ALL_KIND],
                              resolve_provider=True),
    )
    async def code_action(ls: TcauditServer, params: lsp.CodeActionParams) -> list[lsp.CodeAction]:
        uri = params.text_document.uri
        if uri not in ls.documents:
            notebook = ls.workspace.get_notebook_document(cell_uri=uri)
            if notebook is not None and notebook.uri in ls.documents:
                return await ls.cell_code_actions(ls.documents[notebook.uri], params)
            return []
        return await ls.code_actions(params)

    @server.feature(lsp.CODE_ACTION_RESOLVE)
    async def code_action_resolve(ls: TcauditServer, action: lsp.CodeAction) -> lsp.CodeAction:
        data = action.data if isinstance(action.data, dict) else {}
        uri = data.get("uri")
        if action.edit is not None or action.kind != convert.FIX_ALL_KIND or uri not in ls.documents:
            return action
        made = await ls.fix_all_action(ls.documents[uri], action.title)
        if made is not None:
            action.edit = made.edit
        return action

    return server


def _is_python(uri: str, language_id: str | None) -> bool:
    return language_id == "python" or uri.endswith((".py", ".pyw"))


def serve() -> int:
    """Run the server on stdin/stdout until the client says exit."""
    logging.basicConfig(level=logging.WARNING, format="tcaudit server: %(message)s")
    build_server().start_io()
    return 0
