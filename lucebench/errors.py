"""Errors a user can cause. The CLI turns them into one clear message and an exit status, never a traceback."""

from __future__ import annotations


class UserError(Exception):
    """A problem with the user's input (config, paths, flags, result files) or environment.

    ``where`` names the file, line or JSON path; ``hint`` says what would be right.
    ``exit_code`` follows DESIGN.md (2 for bad config or usage unless a command says otherwise).
    """

    def __init__(self, message: str, *, where: str | None = None, hint: str | None = None, exit_code: int = 2):
        super().__init__(message)
        self.message = message
        self.where = where
        self.hint = hint
        self.exit_code = exit_code

    def __str__(self) -> str:
        text = f"{self.where}: {self.message}" if self.where else self.message
        if self.hint:
            text += f"\n  hint: {self.hint}"
        return text


class EngineError(Exception):
    """An engine process failed (crash, hang, protocol violation, error reply). Recorded as the cell's failure."""

    def __init__(self, kind: str, message: str, *, exit_code: int | None = None, signal: str | None = None,
                 stderr_tail: str | None = None):
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.exit_code = exit_code
        self.signal = signal
        self.stderr_tail = stderr_tail
