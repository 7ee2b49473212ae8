#!/bin/sh
# pairctl's evidence remote: pre-receive hook, installed by `pairctl receipts init-remote`
# (orchestrator/evidence/team.py). It enforces on the remote what `receipts verify --remote`
# checks, so a change verify would report is refused before any home pulls it:
#   - only branches refs/heads/homes/<home-id> are pushed, never deleted;
#   - a push only fast-forwards, and no commit is a merge;
#   - no commit changes or removes a receipts/ blob (receipts are only appended);
#   - every new commit is signed (SSH, namespace git) by a key in pairctl/allowed_signers whose
#     principals list `homes/<home-id>` of the branch it is pushed to (each home its own signer).
# Needs only git and ssh-keygen. The allowed signers are the team's file, copied here by
# init-remote; run init-remote again after changing it.
set -u
ZERO=0000000000000000000000000000000000000000
SIGNERS="${GIT_DIR:-.}/pairctl/allowed_signers"
if [ ! -f "$SIGNERS" ]; then
    echo "pairctl evidence remote: $SIGNERS is missing; run \`pairctl receipts init-remote\`" >&2
    exit 1
fi
# the lines bound to one home, beside the signers (the repository is checked for owner and mode
# by init-remote; never a guessable name in a shared /tmp)
TMP=$(mktemp "${GIT_DIR:-.}/pairctl/.bound.XXXXXX") || exit 1
trap 'rm -f "$TMP"' EXIT HUP INT TERM
status=0

refuse() {
    echo "pairctl evidence remote: refused $1: $2" >&2
    status=1
}

# the lines of the allowed signers whose principals (first field, comma separated) hold $1
bound_to() {
    awk -v want="$1" '
        /^[ \t]*(#|$)/ { next }
        { n = split($1, p, ","); for (i = 1; i <= n; i++) if (p[i] == want) { print; next } }
    ' "$SIGNERS"
}

while read -r old new ref; do
    case "$ref" in
        refs/heads/homes/*) home=${ref#refs/heads/homes/} ;;
        *) refuse "$ref" "only refs/heads/homes/<home-id> branches are kept here"; continue ;;
    esac
    case "$home" in
        "" | */* | [!A-Za-z0-9]* | *[!A-Za-z0-9._-]*)
            refuse "$ref" "'$home' does not name an operator home"; continue ;;
    esac
    if [ "$new" = "$ZERO" ]; then
        refuse "$ref" "deletion prohibited: the evidence remote only appends"; continue
    fi
    if [ "$old" = "$ZERO" ]; then
        range=$new
    else
        if ! git merge-base --is-ancestor "$old" "$new" 2>/dev/null; then
            refuse "$ref" "non-fast-forward: the evidence remote only appends"; continue
        fi
        range="$old..$new"
    fi
    merges=$(git rev-list --min-parents=2 "$range" | head -n 1)
    if [ -n "$merges" ]; then
        refuse "$ref" "commit $merges is a merge: a home's branch is one line of appended commits"; continue
    fi
    touched=$(git log --format= --no-renames --diff-filter=DMT --name-only "$range" -- receipts/ | head -n 1)
    if [ -z "$touched" ] && [ "$old" != "$ZERO" ]; then
        touched=$(git diff --no-renames --diff-filter=DMT --name-only "$old" "$new" -- receipts/ | head -n 1)
    fi
    if [ -n "$touched" ]; then
        refuse "$ref" "it changes or removes $touched: receipts are only appended"; continue
    fi
    bad=$(git -c gpg.format=ssh -c "gpg.ssh.allowedSignersFile=$SIGNERS" log --format='%H %G? %GS' "$range" |
        awk '$2 != "G" { print; exit }')
    if [ -n "$bad" ]; then
        refuse "$ref" "commit ${bad%% *} is not signed by a key in the team's allowed signers ($bad)"; continue
    fi
    bound_to "homes/$home" >"$TMP"
    if [ ! -s "$TMP" ]; then
        refuse "$ref" "no key in the allowed signers is bound to this home (add the principal homes/$home to its operator's key)"
        continue
    fi
    bad=$(git -c gpg.format=ssh -c "gpg.ssh.allowedSignersFile=$TMP" log --format='%H %G?' "$range" |
        awk '$2 != "G" { print $1; exit }')
    if [ -n "$bad" ]; then
        who=$(git -c gpg.format=ssh -c "gpg.ssh.allowedSignersFile=$SIGNERS" log -1 --format=%GS "$bad")
        refuse "$ref" "commit $bad is signed by $who, whose key is not bound to home $home (principal homes/$home)"
        continue
    fi
done
exit $status
