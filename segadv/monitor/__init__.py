"""What a run reports: metric files, console progress, image panels."""
