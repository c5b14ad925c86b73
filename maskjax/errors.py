"""Bad input, as the library reports it: the CLIs print these in one line (exit 2); anything else is a bug
and keeps its traceback."""


class ConfigError(ValueError):
    """An unknown name, or a value, shape or setting the method cannot use."""


class MissingFileError(ConfigError, FileNotFoundError):
    """A data file or folder the user named, or that a dataset needs, is not there."""


class OutputFolderError(ConfigError, OSError):
    """The output folder cannot be created or written."""
