from django.apps import AppConfig


class NotifyConfig(AppConfig):
    """Notification channels and the outbox that delivers through them.

    Its tables keep the names they had under the ``dashboard`` app (``dashboard_channel``,
    ``dashboard_notification``): migration ``notify.0001`` adopted them without touching the data.
    """

    name = "dashboard.notify"
    label = "notify"
    verbose_name = "Notifications"
