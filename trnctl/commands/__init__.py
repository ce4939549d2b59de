"""trnctl's commands, one module per command or command group, named as the command is."""
