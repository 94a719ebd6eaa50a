"""The rules of the static security analysis of MCP tool definitions, and the registry that runs them.

Each rule is deterministic and named, and looks for one pattern of tool poisoning: instructions
aimed at the model, credential harvesting, exfiltration, shadowing of other servers' tools,
approval-gated behaviour (rug pulls), hidden text, smuggled Unicode and encoded payloads. Keywords
alone rarely decide: most rules ask whether the text *tells the model to do* something (a
directive) or only *describes* or *quotes* it, so that a secrets scanner that lists `~/.ssh/id_rsa`
or a guardrail that quotes "ignore previous instructions" stays low risk.
"""

from __future__ import annotations

import base64
import binascii
import re
import unicodedata
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from mcpvisor.frontend.gate.security_text import CONFUSABLE_CHARS, Mode, Text, visible, wordset
from mcpvisor.wire.operator import Risk
from mcpvisor.wire.redaction import secret_spans

RISK_ORDER: dict[str, int] = {"low": 0, "medium": 1, "high": 2}
LONG_DESCRIPTION = 1500
VERY_LONG_DESCRIPTION = 5000


# --------------------------------------------------------------------------------------------
# The tool and its neighbours


def _words(name: str) -> set[str]:
    spaced = re.sub(r"([a-z])([A-Z])", r"\1 \2", name)
    return {word for word in re.split(r"[^a-z0-9]+", spaced.lower()) if word}


def _identifier_like(name: str) -> bool:
    return bool(re.search(r"[_\-:.\d]|[a-z][A-Z]", name))


class Catalog:
    """Names of other servers' tools, and a matcher for references to them in prose."""

    def __init__(self, server: str, other_tools: Collection[str]) -> None:
        names: set[str] = set()
        for full in other_tools:
            other_server, sep, plain = full.partition(":")
            if sep and other_server == server:
                continue
            names.add(full)
            if sep and plain:
                names.add(plain)
        self.names = names
        self.lower = {name.lower() for name in names}
        self.plain = {name for name in self.lower if ":" not in name}
        identifiers = sorted((n for n in names if _identifier_like(n) and len(n) >= 3), key=len, reverse=True)
        words = sorted((n for n in names if not _identifier_like(n) and len(n) >= 3), key=len, reverse=True)
        alternatives = []
        # Identifier-like names (send_email, db:query) are references wherever they appear; plain
        # words (search, fetch) only when quoted as code or called a tool.
        if identifiers:
            joined = "|".join(map(re.escape, identifiers))
            alternatives.append(rf"(?<![\w:/.-])(?P<id>{joined})(?![\w-])")
        if words:
            joined = "|".join(map(re.escape, words))
            alternatives.append(rf"[`'\"](?P<quoted>{joined})[`'\"]|\b(?P<word>{joined})\s+tools?\b")
        self.pattern = re.compile("|".join(alternatives), re.I) if alternatives else None


# "the send_email tool", "`fetch` tool": explicit references, even without a catalog.
_NAMED_TOOL = re.compile(
    r"(?<![\w.-])[`'\"]?(?P<name>[A-Za-z][\w.-]*[_:][\w.:-]*\w)[`'\"]?\s+tools?\b"
    r"|`(?P<code>[A-Za-z][\w.-]*)`\s+tools?\b"
    r"|\btools?\s+[`'\"](?P<after>[A-Za-z][\w.:-]*)[`'\"]"
)


@dataclass(frozen=True)
class Reference:
    """A mention of another tool in a text: its span (normalized), its name, whether the catalog knows it."""

    start: int
    end: int
    name: str
    known: bool


class ToolContext:
    """What the rules need to know about the tool being analyzed and its neighbours."""

    def __init__(self, server: str, tool: Mapping[str, Any], catalog: Catalog) -> None:
        self.server = server
        self.name = str(tool.get("name") or "")
        self.title = str(tool.get("title") or "")
        self.catalog = catalog
        schema = tool.get("inputSchema")
        properties = schema.get("properties") if isinstance(schema, Mapping) else None
        self.properties = {str(key).lower() for key in properties} if isinstance(properties, Mapping) else set()
        self.words = _words(self.name) | _words(self.title)
        self.own_names = {self.name.lower(), f"{server}:{self.name}".lower()}

    def references(self, text: Text) -> list[Reference]:
        """References in `text` to tools other than this one (known names and "the X tool")."""
        found: dict[int, Reference] = {}
        ignored = self.own_names | self.properties
        if self.catalog.pattern is not None:
            for match in text.matches(self.catalog.pattern):
                group = next(g for g in ("id", "quoted", "word") if match.group(g))
                name = match.group(group)
                if name.lower() not in ignored:
                    found[match.start(group)] = Reference(match.start(group), match.end(group), name, True)
        for match in text.matches(_NAMED_TOOL):
            group = next(g for g in ("name", "code", "after") if match.group(g))
            name = match.group(group)
            if name.lower() not in ignored and match.start(group) not in found:
                known = name.lower() in self.catalog.lower
                found[match.start(group)] = Reference(match.start(group), match.end(group), name, known)
        return [found[key] for key in sorted(found)]


# --------------------------------------------------------------------------------------------
# Rules


@dataclass(frozen=True)
class Hit:
    """One match of a rule in one text."""

    severity: Risk
    span: tuple[int, int]  # in the original string
    detail: str
    ask: int | None = None  # normalized position of a directive/statement sentence to summarize
    evidence: str | None = None
    mode: Mode = "statement"


@dataclass(frozen=True)
class Rule:
    """A registered rule: its name, the kind of attack it belongs to, and where it runs."""

    name: str
    kind: str
    check: Callable[[Text], Iterator[Hit]]
    on_names: bool
    prose: bool


_RULES: list[Rule] = []


def _rule(
    name: str, kind: str, *, on_names: bool = False, prose: bool = True
) -> Callable[[Callable[[Text], Iterator[Hit]]], Callable[[Text], Iterator[Hit]]]:
    """Register a rule. `on_names` also runs it on the tool name; `prose` runs it on text fields."""

    def register(check: Callable[[Text], Iterator[Hit]]) -> Callable[[Text], Iterator[Hit]]:
        _RULES.append(Rule(name, kind, check, on_names, prose))
        return check

    return register


def _verbs(*bases: str, extra: str = "") -> str:
    """A regex group `verb` matching the given base verbs and their inflections."""
    inflected = "|".join(rf"{base}(?:s|es|ed|d|ing)?" for base in bases)
    return rf"\b(?P<verb>{inflected}{'|' + extra if extra else ''})\b"


def _is_base(match: re.Match[str], bases: Collection[str]) -> bool:
    return match.group("verb").lower() in bases


def _by_mode(mode: Mode, directive: Risk, statement: Risk, mention: Risk = "low") -> Risk:
    return {"directive": directive, "statement": statement, "mention": mention}[mode]


# -- prompt injection -------------------------------------------------------------------------

_OVERRIDE = re.compile(
    r"\b(?P<verb>ignore|disregard|forget|override|overrule|discard)\s+"
    r"(?:(?:all|any|every|of|the|your|my|these|those)\s+)*"
    r"(?:(?:previous|prior|preceding|earlier|above|foregoing|original|initial|existing|system|developer"
    r"|user'?s(?:\s+actual)?)\s+(?:[\w-]+\s+)?"
    r"(?:instructions?|directions?|directives?|prompts?|rules|constraints|context|messages?|requests?"
    r"|guidelines|commands?|guidance|orders|programming)\b"
    r"|(?:above|previous|prior)(?=\s*(?:[.,;:!]|$|\band\b|\bthen\b))"
    r"|everything\s+(?:above|before|else)\b)",
    re.I,
)


@_rule("instruction_override", "prompt_injection")
def _instruction_override(text: Text) -> Iterator[Hit]:
    for match in text.matches(_OVERRIDE):
        mode = text.mode(match.start())
        severity = _by_mode(mode, "high", "medium")
        yield Hit(
            severity,
            text.span(*match.span()),
            f"tells the model to discard its instructions ({mode})",
            ask=match.start() if mode != "mention" else None,
            mode=mode,
        )


_ROLE_MARKER = re.compile(
    r"#{2,}\s*(?:new\s+)?(?:system|admin|developer)\s+(?:message|prompt|instructions?|override)"
    r"|\b(?:new|updated|real|true|actual)\s+system\s+(?:message|prompt|instructions?)"
    r"|<\|?\s*/?\s*(?:system|im_start|im_end|sys)\s*\|?>|\[/?INST\]|<<SYS>>"
    r"|\{\{\s*system\b|\[\s*system(?:\s+(?:message|prompt|note))?\s*\]",
    re.I,
)
_ROLE_LABEL = re.compile(r"\b(?:system|developer)(?:\s+(?:message|prompt|override|instructions?))?\s*:", re.I)


@_rule("role_impersonation", "prompt_injection")
def _role_impersonation(text: Text) -> Iterator[Hit]:
    for match in text.matches(_ROLE_MARKER):
        severity = "low" if text.mode(match.start()) == "mention" else "high"
        yield Hit(severity, text.span(*match.span()), "poses as a system or developer message")
    for match in text.matches(_ROLE_LABEL):
        # Only a label that opens a clause: "SYSTEM: do X", not "the file system: reads ...".
        if text.minor_prefix(match.start()):
            continue
        severity = "low" if text.mode(match.start()) == "mention" else "high"
        yield Hit(severity, text.span(*match.span()), "speaks as the system to the model")


_PERSONA = re.compile(
    r"\byou\s+are\s+now\s+(?:in|a|an|acting|operating|free|unrestricted|allowed|permitted|authori[sz]ed)\b"
    r"|\bdeveloper\s+mode\b|\bjailbr(?:eak|oken)\w*|\bDAN\s+mode\b|\bno\s+longer\s+bound\s+by\b"
    r"|\bact\s+as\s+(?:an?\s+)?(?:unrestricted|unfiltered|uncensored|jailbroken)\b"
    r"|\bpretend\s+(?:that\s+)?(?:you\s+are|you'?re|to\s+be)\b"
    r"|\bwithout\s+(?:any\s+)?(?:restrictions|limitations|filters|censorship)\b|\bno\s+restrictions\b",
    re.I,
)


@_rule("persona_switch", "prompt_injection")
def _persona_switch(text: Text) -> Iterator[Hit]:
    for match in text.matches(_PERSONA):
        mode = text.mode(match.start())
        yield Hit(
            _by_mode(mode, "high", "high"),
            text.span(*match.span()),
            "tries to switch the model into another persona or mode",
            ask=match.start(),
            mode=mode,
        )


_SAFETY_BYPASS = re.compile(
    r"\b(?P<verb>ignore|disregard|bypass|override|disable|skip|circumvent|turn\s+off)\s+"
    r"(?:(?:all|any|the|your|its|of)\s+)*(?:[\w-]+'s\s+)?"
    r"(?:safety|security|content|moderation|guard\w*|ethical)(?:\s+(?:policy|policies|guidelines?|checks?"
    r"|filters?|rules|restrictions?|measures|protections?|rails))?\b"
    r"|\bwithout\s+(?:applying\s+)?(?:any\s+)?(?:safety|security)\s+(?:checks?|filters?|reviews?|guidelines)\b"
    r"|\bcomply\s+with\s+(?:all|any|every)\s+(?:subsequent\s+|future\s+)?(?:requests?|instructions?|commands?)",
    re.I,
)


@_rule("safety_bypass", "prompt_injection")
def _safety_bypass(text: Text) -> Iterator[Hit]:
    for match in text.matches(_SAFETY_BYPASS):
        mode = text.mode(match.start())
        yield Hit(
            _by_mode(mode, "high", "medium"),
            text.span(*match.span()),
            f"asks the model to drop its safety rules ({mode})",
            ask=match.start(),
            mode=mode,
        )


_FOLLOW_EMBEDDED = re.compile(
    r"\b(?P<verb>obey|follow|execute|carry\s+out|comply\s+with|act\s+on)\s+(?:[\w-]+\s+){0,3}?"
    r"(?:instructions?|commands?|directives?)\s+(?:that\s+)?(?:(?:are|is)\s+)?"
    r"(?:found|embedded|contained|included|inside|in|within|from)\b"
    r"|\btreat\s+(?:[\w-]+\s+){0,4}?(?:instructions?|commands?|text|content)\s+(?:[\w-]+\s+){0,6}?as\s+"
    r"(?:an?\s+)?(?:[\w-]+,?\s+){0,3}?(?:commands?|instructions?|orders?)\b",
    re.I,
)


@_rule("follow_embedded_instructions", "prompt_injection")
def _follow_embedded(text: Text) -> Iterator[Hit]:
    for match in text.matches(_FOLLOW_EMBEDDED):
        mode = text.mode(match.start())
        yield Hit(
            _by_mode(mode, "high", "medium"),
            text.span(*match.span()),
            "tells the model to obey instructions found in fetched content",
            ask=match.start(),
            mode=mode,
        )


_DISCLOSURE_BASES = wordset("reveal print output show display leak disclose repeat dump return include send share")
_DISCLOSURE = re.compile(
    _verbs(*_DISCLOSURE_BASES) + r"\s+(?:[\w'-]+\s+){0,4}?"
    r"(?:system\s+prompts?|system\s+instructions|hidden\s+(?:system\s+)?instructions|conversation\s+history"
    r"|chat\s+history|previous\s+messages|your\s+instructions|initial\s+instructions|context\s+window)\b",
    re.I,
)


@_rule("prompt_disclosure", "prompt_injection")
def _prompt_disclosure(text: Text) -> Iterator[Hit]:
    for match in text.matches(_DISCLOSURE):
        mode = text.mode(match.start(), base_form=_is_base(match, _DISCLOSURE_BASES))
        yield Hit(
            _by_mode(mode, "high", "medium"),
            text.span(*match.span()),
            f"asks for the system prompt or conversation ({mode})",
            ask=match.start(),
            mode=mode,
        )


_CONSENT_BYPASS = re.compile(
    r"\b(?:with\s+no|without(?:\s+(?:any|asking\s+for|requesting|seeking|waiting\s+for|the\s+user'?s?|user))*)"
    r"\s+(?:confirmation|approval|permission|consent)\b|\bwithout\s+asking\b",
    re.I,
)


@_rule("consent_bypass", "prompt_injection")
def _consent_bypass(text: Text) -> Iterator[Hit]:
    for match in text.matches(_CONSENT_BYPASS):
        if text.mode(match.start()) == "mention":
            continue
        directive = text.sentence_is_directive(match.start())
        yield Hit(
            "medium" if directive else "low",
            text.span(*match.span()),
            "acts without the user's confirmation",
            ask=match.start(),
            mode="directive" if directive else "statement",
        )


# -- hidden instructions ----------------------------------------------------------------------

_HIDDEN_TAG = re.compile(
    r"<\s*(?:important|secret|hidden|system|instructions?|admin|note|context|assistant|ai|model|prompt"
    r"|critical|override)\b[^<>]{0,40}>",
    re.I,
)


@_rule("hidden_instruction_tag", "hidden_instruction")
def _hidden_tag(text: Text) -> Iterator[Hit]:
    for match in text.matches(_HIDDEN_TAG):
        severity = "low" if text.quoted(match.start()) else "medium"
        yield Hit(severity, text.span(*match.span()), "wraps text in a tag addressed to the model")


_MODEL_NOTE = re.compile(
    r"\bnote\s+(?:to|for)\s+(?:the\s+)?(?:assistant|ai|model|llm|agent|claude|gpt|chatgpt|copilot|gemini)\b"
    r"|[\[(<]\s*(?:assistant|ai|llm|agent|model)\s+(?:instructions?|directives?|notes?)\b"
    r"|\b(?:assistant|ai|llm|agent|model)\s+(?:instructions?|directives?|notes?)\s*:"
    r"|\bhidden\s+(?:directives?|instructions?|commands?|notes?|prompts?)\s*:"
    r"|\binstructions?\s+for\s+(?:the\s+)?(?:assistant|ai|model|llm|agent)\b"
    r"|\b(?:dear|hey|attention)\s+(?:assistant|ai|model|llm|agent|claude)\b",
    re.I,
)


@_rule("model_addressed_note", "hidden_instruction")
def _model_note(text: Text) -> Iterator[Hit]:
    for match in text.matches(_MODEL_NOTE):
        severity = "low" if text.mode(match.start()) == "mention" else "medium"
        yield Hit(severity, text.span(*match.span()), "addresses the model directly, out of the user's sight")


_CONCEAL_VERBS = (
    "append|add|send|include|forward|upload|copy|read|call|attach|insert|bcc|cc|collect|post|exfiltrate"
    "|execute|run|modify|change|replace|write|embed|transmit|share|log|record"
)
_CONCEALMENT = re.compile(
    r"\b(?:do\s+not|don'?t|never|must\s+not|should\s+not)\s+(?:\w+\s+)?"
    r"(?:tell|mention|inform|reveal|disclose|notify|alert|let\s+\w+\s+know)\b(?:\s+\w+){0,4}?\s+"
    r"(?:user|users|human|them|anyone|this|these|it|that)\b"
    r"|\bwithout\s+(?:telling|informing|notifying|alerting|showing|letting|asking)\s+(?:\w+\s+){0,2}?"
    r"(?:user|users|human|them|anyone|him|her)\b"
    rf"|\b(?:silently|secretly|covertly|quietly|discreetly|invisibly|stealthily)\s+(?:\w+\s+)?(?:{_CONCEAL_VERBS})\w*"
    r"|\bkeep\s+(?:this|it|these)\s+(?:\w+\s+)?(?:secret|hidden|confidential|private)\b"
    r"|\b(?:the\s+)?user\s+(?:must|should|need)\s+not\s+(?:know|see|notice|be\s+told)\b",
    re.I,
)


@_rule("concealment", "hidden_instruction")
def _concealment(text: Text) -> Iterator[Hit]:
    for match in text.matches(_CONCEALMENT):
        mode = text.mode(match.start())
        yield Hit(
            _by_mode(mode, "high", "high"),
            text.span(*match.span()),
            "tells the model to hide what it does from the user",
            ask=match.start(),
            mode=mode,
        )


_URGENCY = re.compile(
    r"\b(?:IMPORTANT|CRITICAL|MANDATORY|URGENT|ATTENTION)\b\s*[:!]|\bthis\s+is\s+mandatory\b"
    r"|<\s*(?:IMPORTANT|CRITICAL)\s*>"
)


@_rule("urgency_marker", "hidden_instruction")
def _urgency(text: Text) -> Iterator[Hit]:
    for match in text.matches(_URGENCY):
        yield Hit("low", text.span(*match.span()), "uses emphatic markers to push the model")


# -- credentials --------------------------------------------------------------------------------

_SENSITIVE_PATH = re.compile(
    r"(?<!\w)\.ssh\b(?:/[\w.-]+)?|\bid_(?:rsa|dsa|ecdsa|ed25519)(?:\.pub)?\b"
    r"|\.aws/(?:credentials|config)\b|(?<![\w.])\.env(?:\.[\w-]+)?\b"
    r"|/etc/(?:passwd|shadow|sudoers)\b|(?<![\w.])\.(?:netrc|npmrc|pypirc|git-credentials|pgpass)\b"
    r"|\.docker/config\.json|\.kube/config\b|\.gnupg\b|\.cursor/mcp\.json|claude_desktop_config\.json"
    r"|\.config/gcloud\b|\.config/gh/hosts\.yml|\.azure/\w*|(?:login|keychain)\.db\b|wallet\.dat\b"
    r"|\.(?:bash|zsh)_history\b",
    re.I,
)
_ACCESS_BASES = wordset(
    "read cat open load include pass send upload append attach copy dump print return output "
    "exfiltrate fetch collect extract grab access embed forward put place paste provide supply call "
    "post leak steal get use"
)
_ACCESS_VERB = re.compile(_verbs(*_ACCESS_BASES), re.I)
_INTO_ARGUMENT = re.compile(
    r"\b(?:into|in|inside|as|via|through|to)\s+(?:the\s+|a\s+|an\s+|its\s+|your\s+)?"
    r"(?:[`'\"]?[\w-]+[`'\"]?\s+)?(?:argument|parameter|param|field|property|input|sidenote)s?\b",
    re.I,
)
_CREDENTIAL_WORDS = wordset(
    "ssh key keys secret secrets credential credentials vault keychain env dotenv passwd password "
    "passwords aws gpg gnupg netrc npmrc kube docker wallet"
)


def _related(tool: ToolContext, path: str) -> bool:
    """True when the tool's own name says it works with such files (a credentials reader)."""
    path_words = _words(path) - {"etc", "config", "json", "home", "users", "id"}
    return bool(tool.words & (path_words | _CREDENTIAL_WORDS))


@_rule("sensitive_file", "credential_access")
def _sensitive_file(text: Text) -> Iterator[Hit]:
    for match in text.matches(_SENSITIVE_PATH):
        start, end = text.sentence_bounds(match.start())
        verbs = list(_ACCESS_VERB.finditer(text.norm, start, match.start()))
        if verbs:
            verb = verbs[-1]
            mode = text.mode(verb.start(), base_form=_is_base(verb, _ACCESS_BASES), quotes=False)
        else:
            mode = text.mode(match.start(), quotes=False)
        into_argument = _INTO_ARGUMENT.search(text.norm, match.end(), end) is not None
        related = _related(text.tool, match.group())
        if mode == "mention":
            severity: Risk = "low"
            detail = "mentions a credential file"
        elif into_argument:
            severity, detail = "high", "has the model put a credential file into a tool argument"
        elif mode == "directive":
            severity = "low" if related else "high"
            detail = "tells the model to read a credential file"
        else:
            severity = "low" if related else "medium"
            detail = "reads a credential file" + ("" if related else ", unrelated to the tool's name")
        yield Hit(
            severity,
            text.span(*match.span()),
            detail,
            ask=match.start() if severity != "low" else None,
            mode=mode,
        )


_SECRET_NOUN = (
    r"(?:api[\s_-]?keys?|access[\s_-]?tokens?|auth(?:entication)?[\s_-]?tokens?|bearer\s+tokens?"
    r"|refresh\s+tokens?|secrets?|credentials?|passwords?|passphrases?|private\s+keys?|ssh\s+keys?"
    r"|session\s+(?:cookies?|tokens?)|cookies|environment\s+variables?|env\s+vars?|clipboard"
    r"|seed\s+phrases?|recovery\s+phrases?|mnemonics?)\b"
)
_HARVEST_BASES = wordset(
    "read collect gather harvest extract dump grab steal include append attach embed pass put insert "
    "copy send upload post forward leak exfiltrate output print return reveal list access share "
    "fetch retrieve obtain capture log record store"
)
_HARVEST = re.compile(_verbs(*_HARVEST_BASES) + r"\s+(?:[\w'-]+[\s,]+){0,6}?(?<![/.])" + _SECRET_NOUN, re.I)
_HARVEST_SCOPE = re.compile(
    r"\b(?:user'?s|users'|all|any|every|their|available|stored|you\s+can\s+(?:find|access|see|read))\b", re.I
)


@_rule("secret_harvest", "credential_access")
def _secret_harvest(text: Text) -> Iterator[Hit]:
    for match in text.matches(_HARVEST):
        mode = text.mode(match.start(), base_form=_is_base(match, _HARVEST_BASES))
        if mode == "mention":
            continue
        _, end = text.sentence_bounds(match.start())
        scoped = _HARVEST_SCOPE.search(text.norm, match.start(), end) is not None
        into_argument = _INTO_ARGUMENT.search(text.norm, match.end(), end) is not None
        related = bool(text.tool.words & _words(match.group()) & _CREDENTIAL_WORDS)
        if mode == "directive":
            severity: Risk = "high" if scoped or into_argument else "low" if related else "medium"
        else:
            severity = "medium" if into_argument else "low"
        yield Hit(
            severity,
            text.span(*match.span()),
            f"asks for secrets ({mode})",
            ask=match.start() if severity != "low" else None,
            mode=mode,
        )


_FILE_CONTENTS = re.compile(
    r"\b(?:contents?|text|data|body)\s+of\s+(?:the\s+|their\s+|your\s+|any\s+)?(?:file\s+)?[`'\"]?"
    r"(?P<path>~?/[\w./-]+|\.{1,2}/[\w./-]+|\.[\w-]+(?:/[\w.-]+)*"
    r"|[\w.-]+\.(?:ya?ml|json|toml|ini|conf|cfg|txt|db|key|pem))",
    re.I,
)


@_rule("file_into_argument", "credential_access")
def _file_into_argument(text: Text) -> Iterator[Hit]:
    for match in text.matches(_FILE_CONTENTS):
        mode = text.mode(match.start(), quotes=False)
        _, end = text.sentence_bounds(match.start())
        if mode != "mention" and _INTO_ARGUMENT.search(text.norm, match.end(), end):
            yield Hit(
                "medium",
                text.span(match.start(), end),
                "has the model copy a local file into an argument",
                ask=match.start(),
                mode=mode,
            )


@_rule("embedded_secret", "credential_access")
def _embedded_secret(text: Text) -> Iterator[Hit]:
    spans = secret_spans(text.norm, findings_only=True)
    if spans:
        start, end, _ = spans[0]
        yield Hit("medium", text.span(start, end), f"contains what looks like a live token or key ({len(spans)})")


# -- exfiltration -------------------------------------------------------------------------------

_SEND_BASES = wordset(
    "send post upload forward transmit exfiltrate leak beacon relay mirror sync ship submit report "
    "email push copy pipe share deliver"
)
_SEND = re.compile(_verbs(*_SEND_BASES, extra="sent|copies|copied"), re.I)
_HOSTILE = re.compile(r"\battacker\w*|\bexfil\w*", re.I)
_EXTERNAL = re.compile(
    r"\b(?:external|remote|third[- ]party|outside|foreign|untrusted|unknown)\s+(?:[\w-]+\s+){0,2}?"
    r"(?:hosts?|servers?|endpoints?|urls?|domains?|address(?:es)?|webhooks?|sites?|services?|apis?|inbox"
    r"|buckets?|machines?|locations?|destinations?)\b"
    r"|\b[\w.+-]+@[\w-]+(?:\.[\w-]+)+\b|\b(?:\d{1,3}\.){3}\d{1,3}(?::\d+)?\b",
    re.I,
)
_URL = re.compile(r"\bhttps?://[^\s'\")\]>]+", re.I)
_COVERT_COPY = re.compile(r"\bb?cc(?:'d|'ed|ed|d)?\b", re.I)
_EMAIL = re.compile(r"\b[\w.+-]+@[\w-]+(?:\.[\w-]+)+\b")


@_rule("external_send", "exfiltration")
def _external_send(text: Text) -> Iterator[Hit]:
    for match in text.matches(_SEND):
        verb = match.group("verb").lower()
        base = _is_base(match, _SEND_BASES)
        mode = text.mode(match.start(), base_form=base)
        _, end = text.sentence_bounds(match.start())
        window = (match.end(), min(end, match.end() + 140))
        hostile = _HOSTILE.search(text.norm, *window)
        external = _EXTERNAL.search(text.norm, *window)
        url = _URL.search(text.norm, *window)
        if mode == "mention":
            if hostile or external or url:
                yield Hit("low", text.span(match.start(), window[1]), "mentions sending data out")
            continue
        if hostile or verb.startswith(("exfiltrat", "leak")):
            severity: Risk = "high"
            detail = "sends data to an attacker-controlled destination"
        elif external:
            severity = "high" if mode == "directive" else "medium"
            detail = "sends data to an external destination"
        elif url:
            severity = "medium" if mode == "directive" else "low"
            detail = "sends data to a URL"
        else:
            continue
        found = [m for m in (hostile, external, url) if m]
        stop = max(m.end() for m in found) if found else match.end()
        yield Hit(severity, text.span(match.start(), stop), f"{detail} ({mode})", ask=match.start(), mode=mode)


@_rule("covert_copy", "exfiltration")
def _covert_copy(text: Text) -> Iterator[Hit]:
    for match in text.matches(_COVERT_COPY):
        start, end = text.sentence_bounds(match.start())
        mode = text.mode(match.start())
        if _EMAIL.search(text.norm, start, end) and mode != "mention":
            yield Hit(
                "high",
                text.span(start, end),
                "copies messages to a hidden recipient",
                ask=match.start(),
                mode=mode,
            )


# -- shadowing ----------------------------------------------------------------------------------

_CROSS_DIRECTIVE = re.compile(
    r"\b(?:always|never|must|should|shall|instead|rather\s+than|whenever|every\s+time|each\s+time"
    r"|make\s+sure|be\s+sure|do\s+not|don'?t|in\s+place\s+of|only\s+use|prefer\w*|first|prior\s+to"
    r"|before\s+(?:calling|using|invoking|running)|(?:is|are)\s+(?:called|invoked|used|run))\b",
    re.I,
)
_TAMPERING = re.compile(
    r"\b(?:modif(?:y|ies|ied|ying)|overrid(?:e|es|ing|den)|alter(?:s|ed|ing)?|intercept\w*|hijack\w*"
    r"|re-?route\w*|redirect\w*|route\s+(?:all|every|any)|b?cc(?:'d|'ed|ed|d)?"
    r"|replace\s+(?:its|their|the)\s+(?:outputs?|results?|responses?|values?|data|arguments?))\b",
    re.I,
)


@_rule("cross_tool_instruction", "shadowing")
def _cross_tool_instruction(text: Text) -> Iterator[Hit]:
    seen: set[str] = set()
    for ref in text.references:
        if ref.name.lower() in seen or text.mode(ref.start, quotes=False) == "mention":
            continue
        start, end = text.sentence_bounds(ref.start)
        tampering = _TAMPERING.search(text.norm, start, end)
        directive = _CROSS_DIRECTIVE.search(text.norm, start, end)
        if not (tampering or directive):
            continue
        seen.add(ref.name.lower())
        severity: Risk = "high" if tampering else "medium"
        what = "changes how" if tampering else "instructs the model about"
        origin = "another server's tool" if ref.known else "another tool"
        yield Hit(severity, text.span(start, end), f"{what} {origin} {ref.name!r}", ask=ref.start, mode="directive")


@_rule("tool_reference", "shadowing")
def _tool_reference(text: Text) -> Iterator[Hit]:
    for ref in text.references:
        start, end = text.sentence_bounds(ref.start)
        if _TAMPERING.search(text.norm, start, end) or _CROSS_DIRECTIVE.search(text.norm, start, end):
            continue  # reported by cross_tool_instruction
        origin = "another server's tool" if ref.known else "another tool"
        yield Hit("low", text.span(ref.start, ref.end), f"refers to {origin} {ref.name!r}")
        return


@_rule("name_collision", "shadowing", on_names=True, prose=False)
def _name_collision(text: Text) -> Iterator[Hit]:
    if text.norm.lower() in text.tool.catalog.plain:
        yield Hit("low", (0, len(text.original)), "has the same name as a tool of another server")


# -- rug pull -----------------------------------------------------------------------------------

_APPROVAL_TIMING = re.compile(
    r"\bonce\s+(?:\w+\s+){0,4}?approved\b|\bafter\s+(?:\w+\s+){0,4}?approv(?:al|ed)\b|\bpost-?approval\b"
    r"|\b(?:during|for)\s+(?:the\s+)?review\b|\blater\s+version\s+of\s+(?:this|the)\s+(?:tool|description)\b",
    re.I,
)
_HARMFUL = re.compile(
    r"\b(?:arbitrary|shell\s+commands?|exfiltrat\w*|upload\w*|clipboard|ssh\s+keys?|credentials?|secrets?"
    r"|passwords?|tokens?|api\s+keys?|silently|secretly|covert\w*|benign(?:ly)?|malicious|backdoor)\b",
    re.I,
)


@_rule("approval_gated_behavior", "rug_pull")
def _approval_gated(text: Text) -> Iterator[Hit]:
    for match in text.matches(_APPROVAL_TIMING):
        start, end = text.sentence_bounds(match.start())
        if _HARMFUL.search(text.norm, start, end):
            severity: Risk = "high"
            span, detail = (start, end), "announces harmful behaviour that starts after approval"
        else:
            severity, span, detail = "low", match.span(), "ties its behaviour to the approval step"
        yield Hit(severity, text.span(*span), detail, ask=match.start(), mode="statement")


# -- hidden text --------------------------------------------------------------------------------

_HTML_COMMENT = re.compile(r"<!--(.*?)(?:-->|$)", re.S)
_HIDDEN_MARKUP = re.compile(
    r"display\s*:\s*none|visibility\s*:\s*hidden|font-size\s*:\s*0(?:px)?\b|opacity\s*:\s*0(?:\.0+)?\b"
    r"|\[//\]\s*:\s*#",
    re.I,
)
_WHITESPACE_RUN = re.compile(r"\s{10,}")


@_rule("html_comment", "hidden_text")
def _html_comment(text: Text) -> Iterator[Hit]:
    for match in _HTML_COMMENT.finditer(text.original):
        if match.group(1).strip():
            yield Hit("medium", match.span(), "hides text in an HTML comment the user never sees")


@_rule("hidden_markup", "hidden_text")
def _hidden_markup(text: Text) -> Iterator[Hit]:
    for match in text.matches(_HIDDEN_MARKUP):
        yield Hit("medium", text.span(*match.span()), "uses markup that hides text when rendered")
        return


@_rule("whitespace_padding", "hidden_text")
def _whitespace_padding(text: Text) -> Iterator[Hit]:
    for match in _WHITESPACE_RUN.finditer(text.original):
        run = match.group()
        # Only padding that is followed by more text hides something; trailing blanks do not.
        if match.end() < len(text.original) and (run.count("\n") >= 10 or len(run) - run.count("\n") >= 60):
            yield Hit(
                "medium",
                (match.end(), len(text.original)),
                "pushes text out of view with a long run of blank space",
            )
            return


@_rule("excessive_length", "excessive_length")
def _excessive_length(text: Text) -> Iterator[Hit]:
    size = text.full_length
    if text.location == "description" and size > LONG_DESCRIPTION:
        severity: Risk = "medium" if size > VERY_LONG_DESCRIPTION else "low"
        detail = f"is {size} characters long; text can hide at the end"
        if size > len(text.original):
            detail += f" (only the first {len(text.original)} were analyzed)"
        yield Hit(severity, (LONG_DESCRIPTION, len(text.original)), detail)


# -- unicode smuggling ------------------------------------------------------------------------

_UNICODE_RULES: dict[str, tuple[str, Callable[[int], Risk]]] = {
    "tag_characters": ("carries invisible Unicode tag characters (a hidden ASCII message)", lambda n: "high"),
    "bidi_override": ("reverses the display order of text with bidi override characters", lambda n: "high"),
    "bidi_embedding": (
        "contains bidi control characters in text with no right-to-left script",
        lambda n: "medium",
    ),
    "zero_width": ("contains zero-width characters", lambda n: "high" if n >= 8 else "medium"),
    "variation_selector_payload": ("hides bytes in variation selectors", lambda n: "high"),
    "private_use": ("contains private-use characters with no standard glyph", lambda n: "medium"),
    "control_characters": ("contains terminal control characters", lambda n: "medium"),
    "invisible_format": ("contains invisible formatting characters", lambda n: "low"),
}


def _make_unicode_rule(name: str) -> None:
    description, severity_for = _UNICODE_RULES[name]

    def check(text: Text) -> Iterator[Hit]:
        positions = text.unicode_classes.get(name)
        if not positions:
            return
        detail = f"{description} ({len(positions)})"
        if name == "tag_characters":
            hidden = "".join(
                chr(ord(text.original[p]) - 0xE0000) for p in positions if 0xE0020 <= ord(text.original[p]) <= 0xE007E
            )
            if hidden:
                detail += f"; they spell {visible(hidden, 60)!r}"
        yield Hit(severity_for(len(positions)), (positions[0], positions[0] + 1), detail)

    _rule(name, "unicode_smuggling", on_names=True)(check)


for _name in _UNICODE_RULES:
    _make_unicode_rule(_name)


_LOOKALIKE_SCRIPTS = frozenset({"CYRILLIC", "GREEK", "ARMENIAN", "CHEROKEE", "COPTIC"})


def _script(ch: str) -> str:
    try:
        return unicodedata.name(ch).split(" ", 1)[0]
    except ValueError:
        return ""


@_rule("mixed_script_homoglyphs", "unicode_smuggling", on_names=True)
def _mixed_script(text: Text) -> Iterator[Hit]:
    latin = sum(1 for ch in text.original if ch.isalpha() and _script(ch) == "LATIN")
    letters = sum(1 for ch in text.original if ch.isalpha())
    suspicious = []
    for match in re.finditer(r"[^\W\d_]+", text.original):
        word = match.group()
        scripts = {_script(ch) for ch in word}
        lookalike = scripts & _LOOKALIKE_SCRIPTS
        if not lookalike:
            continue
        mixed = "LATIN" in scripts
        # A whole word of look-alikes (Cyrillic "pay") inside Latin text is as deceptive as a mixed one.
        disguised = letters and latin / letters > 0.8 and all(ch in CONFUSABLE_CHARS for ch in word)
        if mixed or disguised:
            suspicious.append(match)
    if suspicious:
        first = suspicious[0]
        severity: Risk = "high" if text.location == "name" else "medium"
        yield Hit(
            severity,
            first.span(),
            f"mixes look-alike letters of other scripts into Latin words ({len(suspicious)} word(s))",
        )


# -- encoded payloads ---------------------------------------------------------------------------

_BLOB = re.compile(r"(?<![\w+/-])[A-Za-z0-9+/_-]{20,}={0,2}(?![\w+/=-])")
_SHELL = re.compile(
    r"\b(?:curl|wget|bash|zsh|nc|ncat|netcat|powershell|pwsh|chmod|chown|python3?\s+-c|perl\s+-e|eval|iex"
    r"|base64\s+-d|Invoke-\w+)\b|\brm\s+-[a-z]*[rf]|/dev/tcp/|\|\s*(?:ba)?sh\b|/bin/(?:ba)?sh\b|&&",
    re.I,
)


def _decode_blob(token: str) -> tuple[str, str] | None:
    """Decode a hex or base64 token to text, or None when it is not printable text."""
    candidates: list[tuple[str, bytes]] = []
    if len(token) % 2 == 0 and re.fullmatch(r"[0-9a-fA-F]+", token):
        candidates.append(("hex", bytes.fromhex(token)))
    padded = token + "=" * (-len(token) % 4)
    try:
        if re.search(r"[-_]", token):
            candidates.append(("base64", base64.urlsafe_b64decode(padded)))
        else:
            candidates.append(("base64", base64.b64decode(padded, validate=True)))
    except (binascii.Error, ValueError):
        pass
    for encoding, raw in candidates:
        try:
            decoded = raw.decode("utf-8")
        except UnicodeDecodeError:
            continue
        printable = sum(ch.isprintable() or ch in "\n\t" for ch in decoded)
        if len(decoded) >= 8 and printable / len(decoded) >= 0.95 and re.search(r"[A-Za-z]{2}", decoded):
            return encoding, decoded
    return None


@_rule("encoded_payload", "encoded_payload")
def _encoded_payload(text: Text) -> Iterator[Hit]:
    if text.depth:
        return
    secrets = secret_spans(text.norm, findings_only=True)
    for match in text.matches(_BLOB):
        if any(start < match.end() and match.start() < end for start, end, _ in secrets):
            continue  # a token is redacted, never decoded into the report
        token = match.group().rstrip("=")
        if re.fullmatch(r"[a-z]+(?:_[a-z0-9]+)+", token) or not (
            any(ch.isdigit() for ch in token) or (token.lower() != token and token.upper() != token)
        ):
            continue
        decoded = _decode_blob(token)
        if decoded is None:
            continue
        encoding, plain = decoded
        shown = plain
        if re.fullmatch(r"[^\s:{}\[\]\"',]+:[^\s{}\[\]\"',]+", plain):  # user:password, as in HTTP Basic
            shown = "<redacted credential pair>"
        evidence = f"<{encoding}, {len(match.group())} chars> decodes to: {visible(shown, 80)}"
        inner = Text(text.location, plain, text.tool, depth=text.depth + 1)
        inner_risk = max((RISK_ORDER[hit.severity] for _, hit in run_rules(inner)), default=-1)
        if _SHELL.search(plain):
            yield Hit("high", text.span(*match.span()), f"hides a shell command in {encoding}", evidence=evidence)
        elif inner_risk >= RISK_ORDER["medium"]:
            yield Hit("high", text.span(*match.span()), f"hides instructions in {encoding}", evidence=evidence)
        else:
            yield Hit("low", text.span(*match.span()), f"contains {encoding}-encoded text", evidence=evidence)


# --------------------------------------------------------------------------------------------
# Running the rules


def run_rules(text: Text) -> Iterator[tuple[Rule, Hit]]:
    """Every hit of every rule that applies to `text` (a tool name or a text field), in rule order."""
    is_name = text.location == "name"
    for rule in _RULES:
        if (is_name and rule.on_names) or (not is_name and rule.prose):
            for hit in rule.check(text):
                yield rule, hit
