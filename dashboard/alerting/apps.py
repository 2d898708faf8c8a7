from django.apps import AppConfig


class AlertingConfig(AppConfig):
    """Alert rules, their lifecycle and silences.

    Its tables keep the names they had under the ``dashboard`` app (``dashboard_alert``, ...):
    migration ``alerting.0001`` adopted them without touching the data.
    """

    name = "dashboard.alerting"
    label = "alerting"
    verbose_name = "Alerting"

    def ready(self) -> None:
        # The hand-off from collection: every finished collection queues an evaluation.
        from collectors.signals import collection_finished
        from dashboard.alerting.tasks import queue_evaluation

        collection_finished.connect(queue_evaluation, dispatch_uid="alerting.queue_evaluation")
        # A restart plan's new flags are judged with the prefill-squeeze margin in force, which
        # restarts (below alerting) may not import: alerting hands it over.
        from dashboard.alerting.settings import prefill_margin_bytes
        from dashboard.restarts.change import use_prefill_margin

        use_prefill_margin(prefill_margin_bytes)
