"""A later migration written against the first squash (0001 to 0022), by its own name."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("django_pgqueue", "0001_squashed_0022_many_tenants")]

    operations = []
