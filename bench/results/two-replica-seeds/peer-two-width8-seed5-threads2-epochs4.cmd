/usr/bin/python3 /work/main/bench/book_peer.py --width 8 --batch-size 512 --lr 0.2 --epochs 4 --seed 5 --threads 2 --data-dir /usr/share/datasets/fashion-mnist --replicas 2
