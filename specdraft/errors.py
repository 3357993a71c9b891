"""The errors a user's input can cause, in a module light enough to import before any model code
(the CLI reports them in one line without loading torch)."""


class RequestError(ValueError):
    """A request the engine cannot serve as given (the message names the problem)."""


class ModelNotFoundError(Exception):
    """The model could not be found locally; the message says where we looked."""


class DraftModelMismatchError(ValueError):
    """A draft model that cannot draft for the target (another vocabulary); the message says how."""
