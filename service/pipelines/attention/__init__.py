"""/attention: maps, head statistics and importance, under their own budget and CPU share."""
