"""The errors a user's input can cause, in a module light enough to import before any model code
(the CLI reports them in one line without loading torch)."""


class RequestError(ValueError):
    """A request the engine cannot serve as given (the message names the problem; `param`, where
    known, the request field it is about, as OpenAI's errors name it; `code`, where OpenAI has one for
    the problem, such as "context_length_exceeded")."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.param, self.code = param, code


class ModelNotFoundError(Exception):
    """The model could not be found locally; the message says where we looked."""


class DraftModelMismatchError(ValueError):
    """A draft model that cannot draft for the target (another vocabulary); the message says how."""
