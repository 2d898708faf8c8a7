"""Django admin: where an admin sets what SparkOps may not learn by itself.

``Engine.managed`` lets SparkOps stop and start a container without the ``sparkops.manage``
label; the prefill setting overrides the estimate's activation bytes per token.
"""

from django.contrib import admin

from collectors.models import Engine, Node


@admin.register(Node)
class NodeAdmin(admin.ModelAdmin):
    list_display = ("name", "hostname", "mem_total_bytes", "last_collection_at")
    readonly_fields = ("mem_total_bytes", "last_collection_at", "rolled_up_until", "gpu",
                       "gpu_read_at", "ledger", "ledger_baseline", "engine_discovery_error")


@admin.register(Engine)
class EngineAdmin(admin.ModelAdmin):
    list_display = ("name", "node", "phase", "container_state", "managed",
                    "prefill_bytes_per_token")
    list_editable = ("managed", "prefill_bytes_per_token")
    list_filter = ("node", "phase", "managed")
    fields = ("node", "name", "managed", "prefill_bytes_per_token")
    readonly_fields = ("node", "name")
