"""A later migration written against one of the files written after the first squash."""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [("django_pgqueue", "0025_started_steps_stay_run")]

    operations = []
