"""A URLconf with the metrics view, as a project would add it."""

from django.urls import path

from django_pgqueue.metrics.views import metrics

urlpatterns = [path("metrics", metrics)]
