"""Pure domain logic: no boto3, no I/O. Tested without any emulator."""
