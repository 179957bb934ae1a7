"""sluicegate's one typed configuration object, one module per concern.

Every value comes from, in rising priority: the defaults in each concern's module, a `.env`
file, the environment (`SLUICEGATE_*`), and `sluicegate serve --flag` (passed in as init
arguments). A bad value stops start-up with a message that names the setting (see
`describe_error`).
"""

from sluicegate.settings.reporting import (
    ENV_PREFIX,
    SECRET_SETTINGS,
    describe_error,
    redact_url,
)
from sluicegate.settings.settings import Settings

__all__ = ["ENV_PREFIX", "SECRET_SETTINGS", "Settings", "describe_error", "redact_url"]
