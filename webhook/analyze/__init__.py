"""`muster analyze`: name what is misconfigured in a cluster before users meet it."""
