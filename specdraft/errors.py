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


class ModelFetchError(ModelNotFoundError):
    """A model known by name (`specdraft.models.find`) that could not be fetched: its packages could not
    be installed (no network, a package missing); the message names them."""


class ModelIntegrityError(ModelFetchError):
    """A model file that is not the catalogue's: `what` ("size", "sha256" or "file") differs, with the
    `expected` and `actual` values. A file just fetched is removed, and the message names both values;
    a cached file that changed since it was verified is kept, and the message names it and the command
    that fetches it again. Either way it is never loaded."""

    def __init__(self, message: str, what: str, expected: str, actual: str) -> None:
        super().__init__(message)
        self.what, self.expected, self.actual = what, expected, actual


class BadModelFileError(ModelNotFoundError):
    """A model file that cannot be loaded as it is (truncated, corrupted, or of a format, block kind or
    family specdraft does not read): the message names the file and the `problem`, found before
    anything else reads the file (`specdraft.models.gguf_check`)."""

    def __init__(self, message: str, path: str, problem: str) -> None:
        super().__init__(message)
        self.path, self.problem = path, problem
