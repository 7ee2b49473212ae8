"""Reaching hosts: commands as data, one Transport protocol, SSH and local implementations.

command.py   Cmd / Secret: a frozen argv, rendered with shlex.join only for the transport
commands.py  builders for common steps (mkdir, mv -T, ln -sfn, sha256sum, ...), pure
result.py    Result and the errors a failed or timed-out command becomes
transport.py Transport protocol, TransportStats, RetryPolicy, open_transport, TransportPool
ssh.py       SshTransport: strict host keys, one lazy connection, byte-exact exec, SFTP files
local.py     LocalTransport: argv exec'd directly, files copied
"""
