"""A later migration written against the last of the files the first squash replaced."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("django_pgqueue", "0022_many_tenants")]

    operations = []
