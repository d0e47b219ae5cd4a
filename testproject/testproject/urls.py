from django.contrib import admin
from django.urls import include, path

from django_pgqueue.metrics.views import metrics

urlpatterns = [
    path("admin/", admin.site.urls),
    path("shop/", include("shop.urls")),
    # The queues' Prometheus figures, as docs/reference/metrics.md wires them.
    path("internal/metrics", metrics),
]
