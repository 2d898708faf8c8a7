"""The dashboard app's models live with the code that owns them; Django finds them here."""

from dashboard.alerting.models import *  # noqa: F401,F403
from dashboard.notify.models import *  # noqa: F401,F403
from dashboard.restarts.models import *  # noqa: F401,F403,E402
