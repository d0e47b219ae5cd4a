from django.urls import path

from . import views

app_name = "shop"
urlpatterns = [
    path("orders/", views.place_order, name="place-order"),
    path("orders/<int:pk>/", views.order_status, name="order-status"),
    path("products/<str:sku>/stock/", views.adjust_stock, name="adjust-stock"),
]
