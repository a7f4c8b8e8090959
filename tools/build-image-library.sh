#!/bin/bash
#
# Build a small, realistic, byte-reproducible library of Debian test images.
#
# Every image is a raw disk image of $VMAR_IMAGE_MIB MiB (default 1024)
# that boots by itself, as a cloud image does, and is built without mounts
# (doc/source/images.rst):
#
#   MBR          sfdisk, with SYSLINUX's mbr.bin
#   partition 1  FAT16 /boot, 64 MiB from 1 MiB (mkfs.fat, mtools):
#                the cloud kernel, its initramfs, syslinux.cfg and
#                SYSLINUX (syslinux --install on the unmounted file)
#   partition 2  ext4 root (mke2fs -d), to the end of the image
#
# Every image has systemd as init and linux-image-cloud-amd64; the kernel
# command line is "root=UUID=<fixed uuid> ro console=tty0
# console=ttyS0,115200n8 no_timer_check" (without no_timer_check, a TCG
# vCPU that a loaded host starves can miss the kernel's IO-APIC timer
# check, and the kernel panics; Fedora's cloud images skip it too).  A
# oneshot unit, vmar-booted.service, prints "VMAR-BOOTED <name> <seconds
# since kernel start>" through the kernel's log (so on the serial console)
# once multi-user.target is reached (tools/boot_image.py waits for it).
# Every image also carries vmar-guest (vmar_openstack/guest/, enabled; it
# does nothing unless the host asks for guest-private caching) and the
# test probe tools/vmar-test-probe (runs only when the host's SMBIOS OEM
# strings ask).
#
#   minbase     debootstrap --variant=minbase (+ the boot packages)
#   python3     minbase + python3
#   postgresql  minbase + postgresql
#   nginx       minbase + nginx
#   apache2     minbase + apache2
#   mariadb     minbase + mariadb-server
#
# Usage:
#   build-image-library.sh [--force] [OUTDIR] [IMAGE...]
#   build-image-library.sh --check-reproducible[=IMAGE] [--keep]
#   build-image-library.sh --upgrade-tools
#
# OUTDIR defaults to $VMAR_IMAGE_LIBRARY or /var/cache/vmar-openstack/images.
# Progress goes to stderr.  The last stdout lines are "<name> <path>", one
# per image.  An image is rebuilt only when its stamp file
# (<name>.raw.stamp) does not match the hash of this script and of the
# build parameters; --force rebuilds anyway.
#
# --check-reproducible builds one image (default: minbase) twice in
# scratch directories, ignoring the library and its stamps, and compares
# the sha256 of the two images.  It exits 0 if they match, 1 if not
# (--keep keeps both images, for comparing them).
#
# --upgrade-tools upgrades the packages whose versions are in an image's
# stamp (KEY_TOOLS, KEY_COMPILER) to the mirror's newest and builds
# nothing: CI runs it before building, so that the pristine root of its
# fresh-machine stage, whose packages are the mirror's newest, finds the
# images it would build already built (tools/run-tests.sh).
#
# Reproducibility: the same script, parameters and mirror state give
# byte-identical images.  The mirror is a moving target (point releases,
# security updates), so images built on different days may differ.
#
# Environment:
#   VMAR_IMAGE_LIBRARY       output directory
#   VMAR_IMAGE_MIB           virtual image size in MiB (default 1024)
#   VMAR_DEBIAN_MIRROR       default: first URI for the suite in
#                            /etc/apt/sources.list.d/debian.sources
#   VMAR_DEBIAN_SUITE        default: bookworm
#   VMAR_DEBOOTSTRAP_CACHE   .deb cache shared by all builds
#                            (default /var/cache/vmar-openstack/debootstrap)
#   SOURCE_DATE_EPOCH        timestamp for the whole build
#                            (default 1747699200, 2025-05-20T00:00:00Z)
#   VMAR_VERBOSE=1           stream debootstrap's output to stderr
#   TMPDIR                   where the debootstrap trees are built
#                            (default /var/tmp)

set -euo pipefail

readonly ALL_IMAGES=(minbase python3 postgresql nginx apache2 mariadb)
# The packages whose versions are part of an image's key (image_key): the
# tools that make the image, and the compiler of vmar-guest.
readonly KEY_TOOLS=(debootstrap e2fsprogs fdisk dosfstools mtools syslinux
    syslinux-common)
readonly KEY_COMPILER=(gcc libc6-dev)

# What makes every image boot by itself: systemd as init, the Debian cloud
# kernel and the initramfs generator its postinst runs. D-Bus lets
# systemd-logind run, and logind shuts the guest down when the ACPI power
# button is pressed (udev tags it), as Nova's stop and soft reboot ask;
# without it they wait out their timeouts and then power the guest off.
readonly BOOT_INCLUDES="systemd-sysv,udev,dbus,initramfs-tools,zstd,\
linux-image-cloud-amd64"

# Extra packages per image, on top of debootstrap's minbase set and
# $BOOT_INCLUDES.
declare -A IMAGE_INCLUDES=(
    [minbase]=""
    [python3]="python3"
    [postgresql]="postgresql"
    [nginx]="nginx"
    [apache2]="apache2"
    [mariadb]="mariadb-server"
)

SCRIPT_PATH=$(readlink -f "${BASH_SOURCE[0]}")
readonly SCRIPT_PATH
REPO_DIR=$(dirname "$(dirname "$SCRIPT_PATH")")
# Baked into every image: the guest component (product) and the test
# probe (test scaffolding), with the files that make them.
GUEST_DIR=$REPO_DIR/vmar_openstack/guest
GUEST_SOURCES=("$GUEST_DIR/vmar-guest.c" "$GUEST_DIR/vmar-guest.service"
    "$REPO_DIR/tools/vmar-test-probe")
readonly REPO_DIR GUEST_DIR GUEST_SOURCES

DEFAULT_LIBRARY=/var/cache/vmar-openstack/images
IMAGE_MIB=${VMAR_IMAGE_MIB:-1024}
IMAGE_SIZE=${IMAGE_MIB}M
# Partition 1 (FAT /boot): start and size in MiB.
readonly BOOT_START_MIB=1 BOOT_MIB=64
MBR_BIN=/usr/lib/syslinux/mbr/mbr.bin
SUITE=${VMAR_DEBIAN_SUITE:-bookworm}
DEB_CACHE=${VMAR_DEBOOTSTRAP_CACHE:-/var/cache/vmar-openstack/debootstrap}
SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-1747699200}
VERBOSE=${VMAR_VERBOSE:-0}
WORK_BASE=${TMPDIR:-/var/tmp}

# Scratch directories and temporary files removed on exit.
CLEANUP_DIRS=()
CLEANUP_FILES=()

log() {
    printf '%s build-image-library: %s\n' "$(date +%H:%M:%S)" "$*" >&2
}

die() {
    log "ERROR: $*"
    exit 1
}

usage() {
    sed -n '2,/^$/s/^# \{0,1\}//p' "$SCRIPT_PATH" >&2
}

# Unmount anything still mounted below $1 (deepest first), e.g. /proc or
# /sys left behind by an interrupted debootstrap, so that rm cannot reach
# the host's files through them.
umount_below() {
    local dir=$1 mnt
    dir=$(readlink -f "$dir")
    while read -r mnt; do
        [ -n "$mnt" ] || continue
        log "unmounting leftover mount $mnt"
        umount "$mnt" 2>/dev/null || umount -l "$mnt" || true
    done < <(awk -v d="$dir/" 'index($2, d) == 1 { print $2 }' \
        /proc/mounts | sort -r)
}

remove_tree() {
    local dir=$1
    [ -d "$dir" ] || return 0
    umount_below "$dir"
    rm -rf --one-file-system -- "$dir"
}

cleanup() {
    local f d
    for f in "${CLEANUP_FILES[@]}"; do
        rm -f -- "$f"
    done
    for d in "${CLEANUP_DIRS[@]}"; do
        remove_tree "$d"
    done
}

trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

ensure_tools() {
    local missing=()
    command -v debootstrap >/dev/null || missing+=(debootstrap)
    command -v mke2fs >/dev/null || missing+=(e2fsprogs)
    command -v debugfs >/dev/null || missing+=(e2fsprogs)
    command -v sfdisk >/dev/null || missing+=(fdisk)
    command -v mkfs.fat >/dev/null || missing+=(dosfstools)
    command -v mcopy >/dev/null || missing+=(mtools)
    command -v syslinux >/dev/null || missing+=(syslinux)
    [ -f "$MBR_BIN" ] || missing+=(syslinux-common)
    [ "${#missing[@]}" -eq 0 ] && return 0
    [ "$(id -u)" -eq 0 ] || die "need root to install ${missing[*]}"
    log "installing ${missing[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get install -y "${missing[@]}" >&2
}

# First URI of the deb822 stanza in debian.sources that lists $SUITE.
default_mirror() {
    local sources=/etc/apt/sources.list.d/debian.sources uri=""
    if [ -r "$sources" ]; then
        uri=$(awk -v suite="$SUITE" '
            BEGIN { RS = ""; FS = "\n" }
            {
                uris = ""; hit = 0
                for (i = 1; i <= NF; i++) {
                    if ($i ~ /^URIs:/) {
                        split($i, a, /[ \t]+/); uris = a[2]
                    }
                    if ($i ~ /^Suites:/) {
                        n = split($i, s, /[ \t]+/)
                        for (j = 2; j <= n; j++) if (s[j] == suite) hit = 1
                    }
                }
                if (hit && uris != "") { print uris; exit }
            }' "$sources")
    fi
    printf '%s\n' "${uri:-http://deb.debian.org/debian}"
}

# A fixed, valid-looking UUID per image name.
image_uuid() {
    local h
    h=$(printf 'vmar-openstack image library: %s' "$1" | sha256sum)
    printf '%s-%s-4%s-8%s-%s\n' \
        "${h:0:8}" "${h:8:4}" "${h:13:3}" "${h:17:3}" "${h:20:12}"
}

sha256_of() {
    openssl dgst -sha256 -r "$1" | cut -d' ' -f1
}

# Everything that determines an image's bytes, hashed.
image_key() {
    local name=$1
    {
        printf 'script %s\n' "$(sha256sum < "$SCRIPT_PATH" | cut -d' ' -f1)"
        printf 'name %s\n' "$name"
        printf 'include %s %s\n' "$BOOT_INCLUDES" "${IMAGE_INCLUDES[$name]}"
        printf 'layout boot %s+%s MiB\n' "$BOOT_START_MIB" "$BOOT_MIB"
        printf 'uuid %s\n' "$(image_uuid "$name")"
        printf 'size %s\n' "$IMAGE_SIZE"
        printf 'suite %s\n' "$SUITE"
        printf 'mirror %s\n' "$MIRROR"
        printf 'arch %s\n' "$ARCH"
        printf 'source_date_epoch %s\n' "$SOURCE_DATE_EPOCH"
        dpkg-query -W -f='${Package} ${Version}\n' "${KEY_TOOLS[@]}"
        printf 'mke2fs.conf %s\n' \
            "$(sha256sum < /etc/mke2fs.conf | cut -d' ' -f1)"
        sha256sum "${GUEST_SOURCES[@]}" | cut -d' ' -f1
        dpkg-query -W -f='${Package} ${Version}\n' "${KEY_COMPILER[@]}"
    } | sha256sum | cut -d' ' -f1
}

# --upgrade-tools: bring the packages whose versions are in the image key
# to the mirror's newest, as a new machine (and a pristine root,
# tools/fresh-root.sh) installs them: images built here then carry the
# stamps a fresh root's build has, and the root takes them instead of
# building its own.  apt-get's lists are refreshed when older than a day.
upgrade_tools() {
    local lists=/var/lib/apt/lists
    export DEBIAN_FRONTEND=noninteractive
    if [ -z "$(find "$lists" -maxdepth 1 -name '*Packages*' -mmin -1440 \
            -print -quit 2>/dev/null)" ]; then
        apt-get update -q >&2 || die "apt-get update failed"
    fi
    apt-get install -y -q --only-upgrade --no-install-recommends \
        "${KEY_TOOLS[@]}" "${KEY_COMPILER[@]}" >&2 ||
        die "cannot upgrade ${KEY_TOOLS[*]} ${KEY_COMPILER[*]}"
}

run_debootstrap() {
    local name=$1 root=$2 logfile=$3
    local include=$BOOT_INCLUDES${IMAGE_INCLUDES[$name]:+,${IMAGE_INCLUDES[$name]}}
    local args=(--variant=minbase "--arch=$ARCH" "--cache-dir=$DEB_CACHE"
        "--include=$include")
    args+=("$SUITE" "$root" "$MIRROR")
    log "$name: debootstrap ${args[*]}"
    if [ "$VERBOSE" = 1 ]; then
        debootstrap "${args[@]}" 2>&1 | tee "$logfile" >&2
    elif ! debootstrap "${args[@]}" >"$logfile" 2>&1; then
        tail -n 30 "$logfile" >&2
        [ -f "$root/debootstrap/debootstrap.log" ] &&
            tail -n 30 "$root/debootstrap/debootstrap.log" >&2
        die "$name: debootstrap failed"
    fi
}

# Remove what differs between two otherwise identical builds: logs, caches,
# host data copied in by debootstrap, ids and keys generated at install
# time.  Then clamp every mtime to SOURCE_DATE_EPOCH.
normalise_tree() {
    local root=$1 d
    umount_below "$root"

    # apt: binary caches, downloaded .debs, index files of the mirror.
    rm -f "$root"/var/cache/apt/*.bin
    if [ -d "$root/var/cache/apt/archives" ]; then
        find "$root/var/cache/apt/archives" -maxdepth 1 -name '*.deb' -delete
    fi
    if [ -d "$root/var/lib/apt/lists" ]; then
        find "$root/var/lib/apt/lists" -mindepth 1 -maxdepth 1 \
            ! -name partial ! -name lock -exec rm -rf {} +
    fi

    # Logs: keep the files packages created, but empty.
    rm -f "$root/var/log/bootstrap.log"
    find "$root/var/log" -type f -exec truncate -s 0 {} +

    # Backups and caches written with build-time data.
    rm -f "$root"/var/cache/debconf/*-old "$root"/var/lib/dpkg/*-old
    rm -f "$root/var/cache/ldconfig/aux-cache"

    # Host data copied by debootstrap, per-machine ids and keys.
    rm -f "$root/etc/hostname"
    printf 'localhost\n' > "$root/etc/hostname"
    rm -f "$root/etc/resolv.conf"
    if [ -e "$root/etc/machine-id" ]; then
        : > "$root/etc/machine-id"
    fi
    if [ ! -L "$root/var/lib/dbus/machine-id" ]; then
        rm -f "$root/var/lib/dbus/machine-id"
    fi
    rm -f "$root"/etc/ssh/ssh_host_*
    rm -f "$root/etc/ssl/private/ssl-cert-snakeoil.key" \
        "$root/etc/ssl/certs/ssl-cert-snakeoil.pem"
    if [ -d "$root/etc/ssl/certs" ]; then
        find "$root/etc/ssl/certs" -lname '*ssl-cert-snakeoil.pem' -delete
    fi

    # PostgreSQL: the cluster made by the postinst has a random system
    # identifier; a booted image recreates it with pg_createcluster.
    for d in "$root"/var/lib/postgresql/*/main \
        "$root"/etc/postgresql/*/main; do
        [ -d "$d" ] && rm -rf -- "$d"
    done
    for d in "$root"/var/lib/postgresql/* "$root"/etc/postgresql/*; do
        [ -d "$d" ] && rmdir --ignore-fail-on-non-empty -- "$d"
    done

    # MariaDB: the data directory made by the postinst (mysql_install_db)
    # holds creation times and random ids; vmar-mariadb-firstboot.service
    # (install_mariadb_firstboot) makes it again on the first boot.
    if [ -d "$root/var/lib/mysql" ]; then
        find "$root/var/lib/mysql" -mindepth 1 -maxdepth 1 \
            ! -name 'debian-*.flag' -exec rm -rf {} +
    fi

    # Scratch space.
    for d in run tmp var/tmp; do
        if [ -d "$root/$d" ] && [ ! -L "$root/$d" ]; then
            find "$root/$d" -mindepth 1 -delete
        fi
    done

    find "$root" -xdev -newermt "@$SOURCE_DATE_EPOCH" \
        -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +
}

# mke2fs -d copies each inode's ctime and atime from the source tree.
# Neither can be set there (ctime is always "now", and reading the tree
# moves atimes), so set both to SOURCE_DATE_EPOCH on every used inode.
fix_inode_times() {
    local image=$1 cmds=$2
    dumpe2fs "$image" 2>/dev/null | awk -v t="$SOURCE_DATE_EPOCH" '
        /^Inodes per group:/ { ipg = $4 }
        /^First inode:/ { first = $3 }
        /^Group [0-9]+:/ { g = $2; sub(":", "", g); groups = g + 1 }
        /^  Free inodes:/ {
            line = $0; sub(/^  Free inodes: */, "", line)
            n = split(line, r, /, */)
            for (i = 1; i <= n; i++) {
                if (r[i] == "") continue
                if (split(r[i], ab, "-") == 2) {
                    for (j = ab[1]; j <= ab[2]; j++) free[j] = 1
                } else {
                    free[r[i]] = 1
                }
            }
        }
        END {
            if (!ipg || !first || !groups) exit 1
            for (i = 1; i <= groups * ipg; i++) {
                if ((i == 2 || i >= first) && !(i in free)) {
                    printf "sif <%d> ctime @%d\n", i, t
                    printf "sif <%d> atime @%d\n", i, t
                }
            }
        }' > "$cmds" || die "cannot list the inodes of $image"
    E2FSPROGS_FAKE_TIME=$SOURCE_DATE_EPOCH debugfs -w -f "$cmds" "$image" \
        >/dev/null 2>"$cmds.err" ||
        { cat "$cmds.err" >&2; die "debugfs failed on $image"; }
    if grep -v '^debugfs [0-9]' "$cmds.err" | grep -q .; then
        cat "$cmds.err" >&2
        die "debugfs reported errors on $image"
    fi
}

# The serial-console marker: a oneshot unit that runs once
# multi-user.target is reached and prints the image name and the seconds
# since the kernel started (/proc/uptime) through the kernel's log, which
# the kernel's console writes to ttyS0 itself.  Not written to /dev/ttyS0
# as a tty: serial-getty@ttyS0 (Type=idle) can start just after the write
# and its agetty's vhangup() flushes what the UART has not sent yet (a CI
# run lost the marker so).  Level 2 (crit) is above any console loglevel
# a distribution sets, and below emerg, which journald sends to every tty.
install_marker_unit() {
    local root=$1 name=$2
    mkdir -p "$root/usr/local/sbin" \
        "$root/etc/systemd/system/multi-user.target.wants"
    cat > "$root/usr/local/sbin/vmar-booted" <<EOF
#!/bin/sh
# Written by vmar-openstack's tools/build-image-library.sh.
read -r up _ < /proc/uptime
printf '<2>VMAR-BOOTED %s %s\\n' '$name' "\$up" > /dev/kmsg
EOF
    chmod 0755 "$root/usr/local/sbin/vmar-booted"
    cat > "$root/etc/systemd/system/vmar-booted.service" <<'EOF'
[Unit]
Description=Print VMAR-BOOTED on the serial console
After=multi-user.target

[Service]
Type=oneshot
ExecStart=/usr/local/sbin/vmar-booted

[Install]
WantedBy=multi-user.target
EOF
    ln -sfn ../vmar-booted.service \
        "$root/etc/systemd/system/multi-user.target.wants/vmar-booted.service"
}

# vmar-guest (vmar_openstack/guest/), enabled: it does nothing unless the
# host asks for guest-private caching, so every image of the library
# carries it (image property vmar_guest=1). Built here against the same
# Debian release.
install_guest_component() {
    local root=$1
    mkdir -p "$root/usr/local/sbin" \
        "$root/etc/systemd/system/multi-user.target.wants"
    cc -O2 -s -Wall -Werror "-ffile-prefix-map=$REPO_DIR/=" \
        -o "$root/usr/local/sbin/vmar-guest" "$GUEST_DIR/vmar-guest.c" ||
        die "cannot build vmar-guest"
    install -m 0644 "$GUEST_DIR/vmar-guest.service" \
        "$root/etc/systemd/system/vmar-guest.service"
    ln -sfn ../vmar-guest.service \
        "$root/etc/systemd/system/multi-user.target.wants/vmar-guest.service"
}

# The test probe (tools/vmar-test-probe): runs after the marker, does
# nothing unless the host's SMBIOS OEM strings ask for it.
install_test_probe() {
    local root=$1
    install -m 0755 "$REPO_DIR/tools/vmar-test-probe" \
        "$root/usr/local/sbin/vmar-test-probe"
    cat > "$root/etc/systemd/system/vmar-test-probe.service" <<'EOF'
[Unit]
Description=vmar-openstack test probe (asked for by SMBIOS OEM strings)
# after the marker, which is after multi-user.target: without the explicit
# After=multi-user.target, the target would order itself after this unit
# (a cycle systemd breaks by dropping the marker)
After=multi-user.target vmar-booted.service vmar-guest.service

[Service]
Type=oneshot
ExecStart=/usr/local/sbin/vmar-test-probe

[Install]
WantedBy=multi-user.target
EOF
    ln -sfn ../vmar-test-probe.service \
        "$root/etc/systemd/system/multi-user.target.wants/vmar-test-probe.service"
}

# MariaDB's system tables, made on the first boot instead of at build
# time (normalise_tree removes them), with the postinst's own command.
install_mariadb_firstboot() {
    local root=$1
    mkdir -p "$root/etc/systemd/system/mariadb.service.wants"
    cat > "$root/etc/systemd/system/vmar-mariadb-firstboot.service" <<'EOF'
[Unit]
Description=Create the MariaDB system tables on the first boot
ConditionPathExists=!/var/lib/mysql/mysql
Before=mariadb.service

[Service]
Type=oneshot
Environment=TMPDIR=
ExecStart=/usr/bin/mysql_install_db --rpm --cross-bootstrap --user=mysql --disable-log-bin --skip-test-db

[Install]
WantedBy=mariadb.service
EOF
    ln -sfn ../vmar-mariadb-firstboot.service \
        "$root/etc/systemd/system/mariadb.service.wants/vmar-mariadb-firstboot.service"
}

# The applications' units ask the test probe whether they may start
# (vmar-test-probe may-start): not at boot when the host measures their
# start (bench/bench_apps.py, OEM string vmar-test:app=1).
install_app_deferral() {
    local root=$1 unit
    for unit in postgresql@ mariadb nginx apache2; do
        [ -f "$root/lib/systemd/system/$unit.service" ] || continue
        mkdir -p "$root/etc/systemd/system/$unit.service.d"
        cat > "$root/etc/systemd/system/$unit.service.d/vmar-test-app.conf" <<'EOF'
[Service]
# "+": as root, whatever the unit's User= (the OEM strings are root's)
ExecCondition=+/usr/local/sbin/vmar-test-probe may-start
EOF
    done
}

# The FAT volume id of the /boot partition (also the MBR disk id): 8 hex
# digits from the image name.
boot_volid() {
    printf 'vmar-openstack boot volume: %s' "$1" | sha256sum | cut -c1-8
}

boot_volid_dashed() {
    local v
    v=$(boot_volid "$1" | tr '[:lower:]' '[:upper:]')
    printf '%s-%s\n' "${v:0:4}" "${v:4:4}"
}

# prepare_root ROOT NAME UUID BOOTDIR: move the kernel and the initramfs
# out of the root tree into BOOTDIR (they go on the FAT /boot partition,
# mounted on /boot at run time), write /etc/fstab and the marker unit.
prepare_root() {
    local root=$1 name=$2 uuid=$3 bootdir=$4 kver
    kver=$(basename "$(find "$root/lib/modules" -mindepth 1 -maxdepth 1 \
        -type d | sort | tail -n 1)")
    [ -f "$root/boot/vmlinuz-$kver" ] ||
        die "$name: no kernel vmlinuz-$kver in the image"
    [ -f "$root/boot/initrd.img-$kver" ] ||
        die "$name: no initramfs initrd.img-$kver in the image"
    mkdir -p "$bootdir"
    cp -p "$root/boot/vmlinuz-$kver" "$bootdir/vmlinuz"
    cp -p "$root/boot/initrd.img-$kver" "$bootdir/initrd.img"
    find "$root/boot" -mindepth 1 -delete
    cat > "$root/etc/fstab" <<EOF
# <file system> <mount point> <type> <options> <dump> <pass>
UUID=$uuid / ext4 errors=remount-ro 0 1
UUID=$(boot_volid_dashed "$name") /boot vfat defaults,nofail 0 2
EOF
    install_marker_unit "$root" "$name"
    install_guest_component "$root"
    install_test_probe "$root"
    install_app_deferral "$root"
    if [ -f "$root/lib/systemd/system/mariadb.service" ]; then
        install_mariadb_firstboot "$root"
    fi
}

# build_boot_fs NAME UUID BOOTDIR FILE: the FAT /boot file system, with the
# kernel, the initramfs and SYSLINUX, built and filled without mounts
# (mkfs.fat, mtools and syslinux --install all work on the file).
build_boot_fs() {
    local name=$1 uuid=$2 bootdir=$3 file=$4 f
    cat > "$bootdir/syslinux.cfg" <<EOF
SERIAL 0 115200
DEFAULT debian
PROMPT 0
TIMEOUT 0
LABEL debian
  LINUX /vmlinuz
  INITRD /initrd.img
  APPEND root=UUID=$uuid ro console=tty0 console=ttyS0,115200n8 no_timer_check
EOF
    rm -f -- "$file"
    truncate -s "${BOOT_MIB}M" "$file"
    # 4 KiB clusters; mkfs.fat aligns the data area to the cluster size and
    # the partition starts on a MiB boundary, so every file cluster is a
    # 4 KiB-aligned block of the disk.  Hidden sectors = partition start.
    mkfs.fat --invariant -F 16 -s 8 -i "$(boot_volid "$name")" \
        -n VMARBOOT -h "$((BOOT_START_MIB * 2048))" "$file" >/dev/null
    for f in vmlinuz initrd.img syslinux.cfg; do
        touch -d "@$SOURCE_DATE_EPOCH" "$bootdir/$f"
        mcopy -m -i "$file" "$bootdir/$f" "::/$f"
    done
    syslinux --install "$file"
}

# build_image NAME DEST: build NAME into the file DEST (created through a
# temporary file in the same directory and renamed at the end).
#
# Layout of DEST (MBR, partitions aligned to 1 MiB):
#   sector 0        MBR: SYSLINUX's mbr.bin and the partition table
#   partition 1     FAT16 /boot, $BOOT_MIB MiB from $BOOT_START_MIB MiB,
#                   active: kernel, initramfs, syslinux.cfg, ldlinux.*
#   partition 2     ext4 root, from there to the end of the image
build_image() {
    local name=$1 dest=$2
    local uuid work root tmpimg start rootfs bootfs root_start root_mib
    uuid=$(image_uuid "$name")
    start=$SECONDS

    work=$(mktemp -d "$WORK_BASE/vmar-image-$name.XXXXXX")
    CLEANUP_DIRS+=("$work")
    root=$work/root
    mkdir -m 0755 "$root"

    run_debootstrap "$name" "$root" "$work/debootstrap.log"
    log "$name: debootstrap done ($((SECONDS - start)) s)," \
        "$(du -sm "$root" | cut -f1) MB"
    prepare_root "$root" "$name" "$uuid" "$work/boot"
    normalise_tree "$root"
    chmod 0755 "$root"

    root_start=$((BOOT_START_MIB + BOOT_MIB))
    root_mib=$((IMAGE_MIB - root_start))
    rootfs=$work/root.ext4
    bootfs=$work/boot.fat
    log "$name: mke2fs -t ext4 -U $uuid ${root_mib}M"
    E2FSPROGS_FAKE_TIME=$SOURCE_DATE_EPOCH mke2fs -q -F -t ext4 \
        -L "$name" -U "$uuid" -E "hash_seed=$uuid,root_owner=0:0" \
        -d "$root" "$rootfs" "${root_mib}M" >&2
    fix_inode_times "$rootfs" "$work/debugfs.cmds"
    e2fsck -fn "$rootfs" >"$work/fsck.log" 2>&1 ||
        { cat "$work/fsck.log" >&2; die "$name: e2fsck found errors"; }
    log "$name: FAT /boot ${BOOT_MIB}M with SYSLINUX"
    build_boot_fs "$name" "$uuid" "$work/boot" "$bootfs"

    tmpimg=$(mktemp "$(dirname "$dest")/.$name.raw.XXXXXX")
    CLEANUP_FILES+=("$tmpimg")
    truncate -s "${IMAGE_MIB}M" "$tmpimg"
    sfdisk --quiet "$tmpimg" >&2 <<EOF
label: dos
label-id: 0x$(boot_volid "$name")
start=${BOOT_START_MIB}MiB, size=${BOOT_MIB}MiB, type=c, bootable
start=${root_start}MiB, type=83
EOF
    dd if="$MBR_BIN" of="$tmpimg" bs=440 count=1 conv=notrunc status=none
    dd if="$bootfs" of="$tmpimg" bs=1M seek="$BOOT_START_MIB" \
        conv=notrunc,sparse status=none
    dd if="$rootfs" of="$tmpimg" bs=1M seek="$root_start" \
        conv=notrunc,sparse status=none
    chmod 0644 "$tmpimg"
    mv -f -- "$tmpimg" "$dest"

    remove_tree "$work"
    log "$name: built $dest ($((SECONDS - start)) s)"
}

# Build NAME into OUTDIR unless a matching stamp says it is up to date.
build_cached() {
    local name=$1 outdir=$2
    local dest=$outdir/$name.raw stamp=$outdir/$name.raw.stamp key sum tmp
    local lock
    key=$(image_key "$name")
    # CI's chains ask for the library at once: one builds, the others
    # wait and find it up to date
    exec {lock}>"$outdir/.$name.raw.lock"
    flock "$lock"
    if [ "$FORCE" = 0 ] && [ -f "$dest" ] && [ -f "$stamp" ]; then
        if grep -qx "key $key" "$stamp"; then
            log "$name: up to date ($dest)"
            exec {lock}>&-
            return 0
        fi
    fi
    rm -f -- "$stamp"
    build_image "$name" "$dest"
    sum=$(sha256_of "$dest")
    tmp=$(mktemp "$outdir/.$name.raw.stamp.XXXXXX")
    CLEANUP_FILES+=("$tmp")
    {
        printf 'key %s\n' "$key"
        printf 'sha256 %s\n' "$sum"
        printf 'include %s\n' "${IMAGE_INCLUDES[$name]}"
        printf 'size %s\n' "$IMAGE_SIZE"
        printf 'mirror %s\n' "$MIRROR"
        printf 'source_date_epoch %s\n' "$SOURCE_DATE_EPOCH"
        printf 'built %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)"
    } > "$tmp"
    chmod 0644 "$tmp"
    mv -f -- "$tmp" "$stamp"
    exec {lock}>&-
    log "$name: sha256 $sum"
}

check_reproducible() {
    local name=$1 dir a b sa sb
    dir=$(mktemp -d "$WORK_BASE/vmar-repro-$name.XXXXXX")
    [ "$KEEP" = 1 ] || CLEANUP_DIRS+=("$dir")
    a=$dir/1/$name.raw
    b=$dir/2/$name.raw
    mkdir -p "$dir/1" "$dir/2"
    log "reproducibility check of $name: first build"
    build_image "$name" "$a"
    log "reproducibility check of $name: second build"
    build_image "$name" "$b"
    sa=$(sha256_of "$a")
    sb=$(sha256_of "$b")
    log "$name build 1: $sa"
    log "$name build 2: $sb"
    if [ "$sa" = "$sb" ]; then
        log "$name is reproducible"
        [ "$KEEP" = 1 ] && log "images kept in $dir"
        return 0
    fi
    log "$name is NOT reproducible; first differing bytes (offset a b):"
    cmp -l "$a" "$b" | head -n 20 >&2 || true
    [ "$KEEP" = 1 ] && log "images kept in $dir"
    return 1
}

main() {
    local outdir="" name check="" images=() valid
    FORCE=0
    KEEP=0
    while [ $# -gt 0 ]; do
        case $1 in
            -h | --help) usage; exit 0 ;;
            --force) FORCE=1 ;;
            --keep) KEEP=1 ;;
            --check-reproducible) check=minbase ;;
            --check-reproducible=*) check=${1#*=} ;;
            --upgrade-tools)
                [ "$(id -u)" -eq 0 ] || die "must run as root (apt-get)"
                upgrade_tools
                return ;;
            --) shift; break ;;
            -*) usage; die "unknown option $1" ;;
            *) break ;;
        esac
        shift
    done
    if [ $# -gt 0 ]; then
        outdir=$1
        shift
    fi
    outdir=${outdir:-${VMAR_IMAGE_LIBRARY:-$DEFAULT_LIBRARY}}
    images=("$@")
    [ "${#images[@]}" -gt 0 ] || images=("${ALL_IMAGES[@]}")
    if [ -n "$check" ]; then
        images=("$check")
    fi
    for name in "${images[@]}"; do
        valid=0
        [ -n "${IMAGE_INCLUDES[$name]+set}" ] && valid=1
        [ "$valid" = 1 ] ||
            die "unknown image '$name' (known: ${ALL_IMAGES[*]})"
    done

    [ "$(id -u)" -eq 0 ] || die "must run as root (debootstrap, chroot)"
    ensure_tools
    umask 022
    export LC_ALL=C TZ=UTC SOURCE_DATE_EPOCH DEBIAN_FRONTEND=noninteractive
    unset LANG LANGUAGE
    MIRROR=${VMAR_DEBIAN_MIRROR:-$(default_mirror)}
    ARCH=$(dpkg --print-architecture)
    mkdir -p "$DEB_CACHE" "$WORK_BASE"
    DEB_CACHE=$(readlink -f "$DEB_CACHE")
    log "suite $SUITE, mirror $MIRROR, arch $ARCH, size $IMAGE_SIZE," \
        "SOURCE_DATE_EPOCH $SOURCE_DATE_EPOCH"

    if [ -n "$check" ]; then
        check_reproducible "$check"
        return
    fi

    mkdir -p "$outdir"
    outdir=$(readlink -f "$outdir")
    for name in "${images[@]}"; do
        build_cached "$name" "$outdir"
    done
    for name in "${images[@]}"; do
        printf '%s %s\n' "$name" "$outdir/$name.raw"
    done
}

main "$@"
