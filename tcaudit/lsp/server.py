"""``tcaudit server``: tcaudit as a language server (the Language Server Protocol over stdio, on pygls).

What it does for each Python document the editor opens:

* **Diagnostics at typing speed.** On open and on every change the script rules scan the editor's
  text, from memory (:func:`tcaudit.api.scan` with a text), in a worker thread: the editor never
  waits, and a scan that a newer change overtakes is followed at once by one of the newest text.
* **The model audit on save.** On save (where the settings let scan build models: ``exec-models``
  and a TC1 rule enabled) the models the saved file builds are audited in a second worker thread,
  from and into the scan cache ``tcaudit scan`` keeps, so an unchanged model costs a cache read. Its
  findings join the diagnostics, and the script rules decide with what it measured, until the
  next save.
* **Quick fixes.** Every finding whose fix is available gets a code action with the fix's own
  edits ("Apply numerics fix: ..."), computed for the text as it is when the editor asks; "Fix
  all safe" (``source.fixAll.tcaudit``) makes ``tcaudit fix --classes safe`` on the whole text;
  "Suppress TCxxx on this line" adds the rule's code to a ``# noqa:`` comment.

Settings come from the same config files the command line reads (the nearest ``pyproject.toml``,
``tcaudit.toml`` or ``.tcaudit.toml`` upward from the document), with the client's
``initializationOptions.settings`` (config keys) on top; a saved config file is read again.
"""

from __future__ import annotations

import asyncio
import logging
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lsprotocol import types as lsp
from pygls.lsp.server import LanguageServer
from pygls.uris import to_fs_path

from tcaudit import __version__, api
from tcaudit.config import CONFIG_NAMES, ConfigError, Settings, load_settings
from tcaudit.findings import Finding
from tcaudit.lsp import convert

log = logging.getLogger(__name__)


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
    # The findings with their fixes' edits, for the (version, lines) they were computed for.
    edits_for: tuple[tuple, list[Finding]] | None = None


class TcauditServer(LanguageServer):
    def __init__(self) -> None:
        super().__init__("tcaudit", __version__, text_document_sync_kind=lsp.TextDocumentSyncKind.Incremental)
        self.documents: dict[str, Document] = {}
        self.options: dict[str, Any] = {}  # initializationOptions.settings: config keys
        self.model_audit = True  # initializationOptions.modelAudit
        self._settings: dict[str, Settings] = {}  # by the folder the config is looked for from
        self.scans = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tcaudit-scan")
        self.audits = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tcaudit-audit")

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
        loop = asyncio.get_running_loop()
        try:
            while True:
                document.stale = False
                text_document = self.workspace.get_text_document(document.uri)
                text, version = text_document.source, text_document.version
                settings = self.settings_for(document)
                try:
                    findings = await loop.run_in_executor(self.scans, self._scan, document, settings, text, False)
                except Exception as exc:  # noqa: BLE001 - a bug must not end the server
                    self.log(lsp.MessageType.Error, f"tcaudit: internal error while scanning {document.display}: {exc!r}")
                    findings = api.Findings.empty()
                for error in findings.errors:
                    self.log(lsp.MessageType.Error, f"tcaudit: {error.splitlines()[0]}")
                if document.closed:
                    return
                if not document.stale:
                    self.publish(document, text_document, version, findings)
                    return
        finally:
            document.scanning = False

    def _scan(self, document: Document, settings: Settings, text: str, edits) -> api.Findings:
        """The document's findings (in a worker thread: nothing here talks to the client); ``edits``:
        False, or the (first, last) lines whose findings get their fixes' edits."""
        return api.scan(text=text, filename=document.display, settings=settings, edits=edits,
                        models=document.models, model_findings=document.model_findings)

    def publish(self, document: Document, text_document, version: int | None, findings: list[Finding]) -> None:
        lines, codec = text_document.lines, text_document.position_codec
        diagnostics = [convert.diagnostic(f, lines, codec, document.uri, findings) for f in findings]
        self.text_document_publish_diagnostics(lsp.PublishDiagnosticsParams(
            uri=document.uri, version=version, diagnostics=diagnostics))

    def log(self, kind: lsp.MessageType, message: str) -> None:
        self.window_log_message(lsp.LogMessageParams(type=kind, message=message))

    # -- the model audit ----------------------------------------------------------------------------
    def schedule_audit(self, uri: str) -> None:
        document = self.document(uri)
        if document.path is None or not self.model_audit:
            return
        settings = self.settings_for(document)
        from tcaudit.engine import model_audit_wanted

        if not model_audit_wanted(settings):
            return
        asyncio.get_running_loop().create_task(self._audit(document, settings))

    async def _audit(self, document: Document, settings: Settings) -> None:
        loop = asyncio.get_running_loop()
        try:
            models, findings, notes = await loop.run_in_executor(self.audits, _audit_file, document, settings)
        except Exception as exc:  # noqa: BLE001
            self.log(lsp.MessageType.Error, f"tcaudit: internal error in the model audit of {document.display}: {exc!r}")
            return
        for note in notes:
            self.log(lsp.MessageType.Info, f"tcaudit: {note}")
        if document.closed:
            return
        document.models, document.model_findings = models, findings
        document.edits_for = None
        self.schedule_scan(document.uri)

    # -- code actions ------------------------------------------------------------------------------
    async def code_actions(self, params: lsp.CodeActionParams) -> list[lsp.CodeAction]:
        document = self.document(params.text_document.uri)
        text_document = self.workspace.get_text_document(document.uri)
        text, version = text_document.source, text_document.version
        lines, codec = text_document.lines, text_document.position_codec
        settings = self.settings_for(document)
        loop = asyncio.get_running_loop()
        # The fixes' edits of the findings on the lines asked about (each costs a codemod run).
        asked_lines = (params.range.start.line + 1, params.range.end.line + 1)
        key = (version, asked_lines)
        if document.edits_for is not None and document.edits_for[0] == key:
            findings = document.edits_for[1]
        else:
            findings = list(await loop.run_in_executor(self.scans, self._scan, document, settings, text, asked_lines))
            document.edits_for = (key, findings)
        wanted = params.context.only
        capabilities = self.client_capabilities.workspace
        versioned = bool(capabilities and capabilities.workspace_edit and capabilities.workspace_edit.document_changes)
        actions: list[lsp.CodeAction] = []
        asked = params.range
        for finding in findings:
            span = convert.finding_range(finding, lines, codec)
            if not _overlaps(span, asked):
                continue
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
        if _wants(wanted, convert.FIX_ALL_KIND) and any(
                f.fix is not None and f.fix.available and f.fix.fix_class.value == "safe" for f in findings):
            result = await loop.run_in_executor(self.scans, _fix_all_safe, document, settings, text)
            if result.changed:
                actions.append(lsp.CodeAction(
                    title=f"Fix all safe tcaudit findings ({', '.join(result.applied)})",
                    kind=convert.FIX_ALL_KIND,
                    edit=convert.workspace_edit(document.uri, version,
                                                [convert.whole_text_edit(lines, result.text, codec)], versioned),
                ))
        return actions


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
    return not only or any(kind == k or kind.startswith(f"{k}.") for k in only)


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
            ls.documents[params.text_document.uri].edits_for = None
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

    @server.feature(lsp.TEXT_DOCUMENT_DID_CLOSE)
    def did_close(ls: TcauditServer, params: lsp.DidCloseTextDocumentParams) -> None:
        document = ls.documents.pop(params.text_document.uri, None)
        if document is not None:
            document.closed = True
            ls.text_document_publish_diagnostics(lsp.PublishDiagnosticsParams(uri=document.uri, diagnostics=[]))

    @server.feature(lsp.WORKSPACE_DID_CHANGE_WATCHED_FILES)
    def did_change_watched(ls: TcauditServer, params: lsp.DidChangeWatchedFilesParams) -> None:
        if any(change.uri.rsplit("/", 1)[-1] in CONFIG_NAMES for change in params.changes):
            ls.forget_settings()
            for open_uri in list(ls.documents):
                ls.schedule_scan(open_uri)

    @server.feature(
        lsp.TEXT_DOCUMENT_CODE_ACTION,
        lsp.CodeActionOptions(code_action_kinds=[lsp.CodeActionKind.QuickFix, convert.FIX_ALL_KIND]),
    )
    async def code_action(ls: TcauditServer, params: lsp.CodeActionParams) -> list[lsp.CodeAction]:
        if params.text_document.uri not in ls.documents:
            return []
        return await ls.code_actions(params)

    return server


def _is_python(uri: str, language_id: str | None) -> bool:
    return language_id == "python" or uri.endswith((".py", ".pyw"))


def serve() -> int:
    """Run the server on stdin/stdout until the client says exit."""
    logging.basicConfig(level=logging.WARNING, format="tcaudit server: %(message)s")
    build_server().start_io()
    return 0
